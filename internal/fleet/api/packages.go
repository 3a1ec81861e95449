package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/artifacts"
	"github.com/myriarch/myriarch/internal/fleet/releases"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/fleet/upgrades"
)

// registerPackages adds the agent software endpoints: package sources,
// releases, stored artifacts with download progress, and the versions the
// fleet runs.
func (a *API) registerPackages(mux *http.ServeMux) {
	a.route(mux, store.RoleViewer, "GET /api/v1/packages", a.listPackages)
	a.route(mux, store.RoleOperator, "PUT /api/v1/packages/{name}", a.putPackage)
	a.route(mux, store.RoleOperator, "DELETE /api/v1/packages/{name}", a.deletePackage)
	a.route(mux, store.RoleViewer, "GET /api/v1/packages/{name}/releases", a.listReleases)
	a.route(mux, store.RoleViewer, "GET /api/v1/releases", a.listReleases)
	a.route(mux, store.RoleViewer, "GET /api/v1/artifacts", a.listArtifacts)
	a.route(mux, store.RoleViewer, "GET /api/v1/packages/versions", a.packageVersions)
	a.route(mux, store.RoleOperator, "POST /api/v1/packages/{name}/offers", a.offerPackage)
	a.registerPackageRollouts(mux)
}

// SoftwareView is what the API and the UI show about agent software.
type SoftwareView struct {
	Sources   []releases.Source           `json:"sources"`
	Releases  []releases.Release          `json:"releases"`
	Blobs     []artifacts.Blob            `json:"blobs"`
	Downloads []artifacts.Progress        `json:"downloads"`
	Versions  []store.PackageVersionCount `json:"versions"`
	Rollouts  []upgrades.Rollout          `json:"rollouts"`
}

// Software gathers the whole agent software view (also used by the UI).
func (a *API) Software(r *http.Request) (SoftwareView, error) {
	ctx, p := r.Context(), a.o.Store.Pool
	var v SoftwareView
	var errs [6]error
	v.Sources, errs[0] = releases.ListSources(ctx, p)
	v.Releases, errs[1] = releases.ListReleases(ctx, p, "")
	v.Blobs, errs[2] = artifacts.Blobs(ctx, p)
	v.Downloads, errs[3] = artifacts.Downloads(ctx, p)
	v.Versions, errs[4] = a.o.Store.PackageVersions(ctx)
	v.Rollouts, errs[5] = upgrades.List(ctx, p)
	return v, errors.Join(errs[:]...)
}

func (a *API) listPackages(w http.ResponseWriter, r *http.Request) {
	s, err := releases.ListSources(r.Context(), a.o.Store.Pool)
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"packages": nonNil(s)})
}

// PackageRequest is the body of PUT /api/v1/packages/{name}.
type PackageRequest struct {
	Type       string `json:"type"`
	Source     string `json:"source"`
	Constraint string `json:"constraint"`
	// PollInterval is a Go duration string ("5m").
	PollInterval string `json:"poll_interval"`
	PublicKey    string `json:"public_key"`
}

func (a *API) putPackage(w http.ResponseWriter, r *http.Request) {
	var req PackageRequest
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
	d, err := time.ParseDuration(strings.TrimSpace(req.PollInterval))
	if err != nil {
		writeErr(w, http.StatusBadRequest, fmt.Sprintf("poll_interval %q: must be a Go duration such as 5m", req.PollInterval))
		return
	}
	s := releases.Source{Name: r.PathValue("name"), Type: req.Type, Source: req.Source, Constraint: req.Constraint, PollInterval: d, PublicKey: req.PublicKey}
	if err := releases.PutSource(r.Context(), a.o.Store.Pool, s); err != nil {
		code := http.StatusInternalServerError
		if s.Validate() != nil {
			code = http.StatusBadRequest
		}
		writeErr(w, code, err.Error())
		return
	}
	a.o.Log.Info("package source set", "package", s.Name, "type", s.Type, "source", s.Source, "by", tokenRef(r.Context()))
	s.PollIntervalS = d.Seconds()
	writeJSON(w, http.StatusOK, s)
}

func (a *API) deletePackage(w http.ResponseWriter, r *http.Request) {
	err := releases.DeleteSource(r.Context(), a.o.Store.Pool, r.PathValue("name"))
	switch {
	case errors.Is(err, releases.ErrNotFound):
		writeErr(w, http.StatusNotFound, "no such package: "+r.PathValue("name"))
	case err != nil:
		writeErr(w, http.StatusInternalServerError, err.Error())
	default:
		a.o.Log.Info("package source deleted", "package", r.PathValue("name"), "by", tokenRef(r.Context()))
		w.WriteHeader(http.StatusNoContent)
	}
}

func (a *API) listReleases(w http.ResponseWriter, r *http.Request) {
	rs, err := releases.ListReleases(r.Context(), a.o.Store.Pool, r.PathValue("name"))
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"releases": nonNil(rs)})
}

func (a *API) listArtifacts(w http.ResponseWriter, r *http.Request) {
	v, err := a.Software(r)
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"blobs": nonNil(v.Blobs), "downloads": nonNil(v.Downloads)})
}

func (a *API) packageVersions(w http.ResponseWriter, r *http.Request) {
	vs, err := a.o.Store.PackageVersions(r.Context())
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"versions": nonNil(vs)})
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// OfferRequest is the body of POST /api/v1/packages/{name}/offers.
type OfferRequest struct {
	Version string   `json:"version"`
	Agents  []string `json:"agents"`
}

func (a *API) offerPackage(w http.ResponseWriter, r *http.Request) {
	var req OfferRequest
	var raw bytes.Buffer // for checkJSONText
	dec := json.NewDecoder(io.TeeReader(http.MaxBytesReader(w, r.Body, 1<<20), &raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeErr(w, http.StatusBadRequest, "body: "+err.Error())
		return
	}
	if err := checkJSONText(raw.Bytes()); err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	if req.Version == "" {
		writeErr(w, http.StatusBadRequest, `version "": must name a recorded release (GET /api/v1/packages/{name}/releases)`)
		return
	}
	offers, err := artifacts.OfferVersion(r.Context(), a.o.Store.Pool, r.PathValue("name"), req.Version, req.Agents, tokenRef(r.Context()))
	switch {
	case errors.Is(err, artifacts.ErrNotOfferable):
		writeErr(w, http.StatusConflict, err.Error())
	case err != nil:
		writeErr(w, http.StatusInternalServerError, err.Error())
	default:
		a.o.Log.Info("package offered", "package", r.PathValue("name"), "version", req.Version, "agents", len(offers), "by", tokenRef(r.Context()))
		writeJSON(w, http.StatusOK, map[string]any{"offers": offers})
	}
}
