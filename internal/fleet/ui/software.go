package ui

import (
	"net/http"
)

// software is the agent software page: package sources with their last
// poll and error, releases and assets, stored blobs, downloads with their
// progress, and the versions the fleet runs.
func (h *handler) software(w http.ResponseWriter, r *http.Request) {
	v, err := h.a.Software(r)
	if err != nil {
		h.fail(w, err)
		return
	}
	running := false
	for _, d := range v.Downloads {
		running = running || d.State == "downloading"
	}
	for _, ro := range v.Rollouts {
		running = running || ro.FinishedAt == nil
	}
	// A page with a running download or upgrade reloads itself (?refresh=0 stops it).
	h.renderRefresh(w, r, "software", "Agent software", v, running && r.URL.Query().Get("refresh") != "0")
}
