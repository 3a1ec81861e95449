package api

import (
	"fmt"
	"net/http"

	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// planRollout answers rollout.Plan for the body of POST /api/v1/rollouts.
func (a *API) planRollout(w http.ResponseWriter, r *http.Request) {
	var req rollout.Request
	if !a.readJSON(w, r, &req, rolloutRequestShape) {
		return
	}
	p, err := a.Rollouts().Plan(r.Context(), req)
	if err != nil {
		serviceErr(w, err, "configuration "+req.Config)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

// previewRevision answers configs.Preview: the agents assigned to the
// configuration (narrowed by ?selector=k=v,...), grouped by what they run
// now, with the diff to the revision.
func (a *API) previewRevision(w http.ResponseWriter, r *http.Request) {
	rev, ok := pathInt(w, r, "rev")
	if !ok {
		return
	}
	narrow, err := store.ParseSelector(r.URL.Query().Get("selector"))
	if err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	name := r.PathValue("name")
	p, err := a.Configs().Preview(r.Context(), name, int(rev), narrow)
	if err != nil {
		serviceErr(w, err, fmt.Sprintf("revision %d of configuration %s", rev, name))
		return
	}
	writeJSON(w, http.StatusOK, p)
}
