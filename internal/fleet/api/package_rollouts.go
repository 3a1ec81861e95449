package api

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/upgrades"
)

// PackageRolloutRequest is the body of POST /api/v1/packages/{name}/rollouts:
// the version and the fields of a rollout spec (waves, max_in_progress,
// bake_s, apply_timeout_s, failure_policy, max_failed, max_failed_percent,
// selector).
type PackageRolloutRequest struct {
	Version string `json:"version"`
	rollout.Spec
}

func (a *API) createPackageRollout(w http.ResponseWriter, r *http.Request) {
	var req PackageRolloutRequest
	if !readBody(w, r, 64<<10, &req) {
		return
	}
	ro, err := upgrades.Create(r.Context(), a.o.Store.Pool, r.PathValue("name"), req.Version, req.Spec, tokenRef(r.Context()))
	if err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	a.o.Log.Info("package rollout created", "id", ro.ID, "package", ro.Package, "version", ro.Version, "by", tokenRef(r.Context()))
	writeJSON(w, http.StatusCreated, ro)
}

func (a *API) listPackageRollouts(w http.ResponseWriter, r *http.Request) {
	rs, err := upgrades.List(r.Context(), a.o.Store.Pool)
	writeList(w, rs, err, "", func(l []upgrades.Rollout) any { return PackageRolloutList{Rollouts: l} })
}

func (a *API) commandPackageRollout(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		writeErr(w, http.StatusBadRequest, "id "+strconv.Quote(r.PathValue("id"))+": must be a number")
		return
	}
	err = upgrades.Request(r.Context(), a.o.Store.Pool, id, r.PathValue("command"))
	switch {
	case errors.Is(err, upgrades.ErrNotFound):
		writeErr(w, http.StatusNotFound, err.Error())
	case err != nil:
		writeErr(w, http.StatusBadRequest, err.Error())
	default:
		a.o.Log.Info("package rollout command", "id", id, "command", r.PathValue("command"), "by", tokenRef(r.Context()))
		w.WriteHeader(http.StatusAccepted)
	}
}
