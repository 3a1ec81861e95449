package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/fleet/upgrades"
)

// registerPackageRollouts adds upgrades of agent software as rollouts.
func (a *API) registerPackageRollouts(mux *http.ServeMux) {
	a.route(mux, store.RoleOperator, "POST /api/v1/packages/{name}/rollouts", a.createPackageRollout)
	a.route(mux, store.RoleViewer, "GET /api/v1/package-rollouts", a.listPackageRollouts)
	a.route(mux, store.RoleOperator, "POST /api/v1/package-rollouts/{id}/{command}", a.commandPackageRollout)
}

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
	var raw bytes.Buffer // for checkJSONText
	dec := json.NewDecoder(io.TeeReader(http.MaxBytesReader(w, r.Body, 64<<10), &raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeErr(w, http.StatusBadRequest, "body: "+err.Error())
		return
	}
	if err := checkJSONText(raw.Bytes()); err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
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
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"rollouts": nonNil(rs)})
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
