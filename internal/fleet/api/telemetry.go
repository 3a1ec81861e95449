package api

import (
	"net/http"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/telemetry"
	"github.com/myriarch/myriarch/internal/godur"
)

// AgentTelemetry is an agent's own metrics over a window.
type AgentTelemetry struct {
	InstanceUID string `json:"instance_uid"`
	telemetry.Window
}

// FleetTelemetry is the fleet's sums over a window.
type FleetTelemetry struct {
	telemetry.Window
}

// window reads ?window= (a duration, default def) and answers 400 when it
// is bad, or 404 when telemetry is off; ok false then.
func (a *API) telemetryWindow(w http.ResponseWriter, r *http.Request, def time.Duration) (time.Duration, bool) {
	if a.o.Telemetry == nil {
		writeErr(w, http.StatusNotFound, "telemetry is off on this replica (telemetry.enabled false)")
		return 0, false
	}
	win := def
	if v := r.URL.Query().Get("window"); v != "" {
		d, err := godur.Parse(v)
		if err != nil {
			writeErr(w, http.StatusBadRequest, "window "+v+": "+err.Error())
			return 0, false
		}
		win = d
	}
	if err := a.o.Telemetry.CheckWindow(win); err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return 0, false
	}
	return win, true
}

func (a *API) agentTelemetry(w http.ResponseWriter, r *http.Request) {
	win, ok := a.telemetryWindow(w, r, 5*time.Minute)
	if !ok {
		return
	}
	uid := r.PathValue("uid")
	if _, err := a.o.Store.GetAgent(r.Context(), uid); agentErr(w, uid, err) {
		return
	}
	tw, err := a.o.Telemetry.Agent(r.Context(), uid, win)
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, AgentTelemetry{InstanceUID: uid, Window: tw})
}

func (a *API) fleetTelemetry(w http.ResponseWriter, r *http.Request) {
	win, ok := a.telemetryWindow(w, r, time.Hour)
	if !ok {
		return
	}
	tw, err := a.o.Telemetry.Fleet(r.Context(), win)
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, FleetTelemetry{Window: tw})
}

// Telemetry is the reader of the agents' own metrics (nil: off), for the UI.
func (a *API) Telemetry() *telemetry.Reader { return a.o.Telemetry }
