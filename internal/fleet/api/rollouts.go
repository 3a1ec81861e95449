package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/gitops"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// rolloutRequestShape is the body of POST /api/v1/rollouts and of its plan.
const rolloutRequestShape = `{"config": "<name>", "to_revision": N, "spec": {"waves": [...], "order": "uid|standbys-first", ...}}`

// Configs is the configuration service (also used by the UI).
func (a *API) Configs() configs.Service { return configs.Service{Store: a.o.Store} }

// Rollouts is the rollout service (also used by the UI).
func (a *API) Rollouts() rollout.Service { return rollout.Service{Store: a.o.Store} }

// serviceErr writes the status that fits err.
func serviceErr(w http.ResponseWriter, err error, what string) {
	var inv1 *configs.InvalidError
	var inv2 *rollout.InvalidError
	switch {
	case errors.As(err, &inv1) && inv1.Content:
		// Content its type's checks refuse: 422, as PUT .../agents/{uid}/config.
		writeErr(w, http.StatusUnprocessableEntity, err.Error())
	case errors.As(err, &inv1), errors.As(err, &inv2):
		writeErr(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, store.ErrNotFound):
		writeErr(w, http.StatusNotFound, "no "+what)
	case errors.Is(err, rollout.ErrConflict):
		writeErr(w, http.StatusConflict, err.Error())
	default:
		writeErr(w, http.StatusInternalServerError, err.Error())
	}
}

func (a *API) readJSON(w http.ResponseWriter, r *http.Request, v any, shape string) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, a.o.MaxConfigBytes+4096))
	if err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return false
	}
	if int64(len(body)) > a.o.MaxConfigBytes+4095 {
		writeErr(w, http.StatusRequestEntityTooLarge, "body: larger than "+strconv.FormatInt(a.o.MaxConfigBytes, 10)+" bytes")
		return false
	}
	dec := json.NewDecoder(bytesReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeErr(w, http.StatusBadRequest, "body: must be JSON "+shape+": "+err.Error())
		return false
	}
	if err := checkJSONText(body); err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return false
	}
	return true
}

// ConfigList is the answer of GET /api/v1/configs.
type ConfigList struct {
	Configs []store.ConfigDef `json:"configs"`
}

func (a *API) listConfigs(w http.ResponseWriter, r *http.Request) {
	cs, err := store.ListConfigs(r.Context(), a.o.Store.Pool)
	writeList(w, cs, err, "", func(cs []store.ConfigDef) any { return ConfigList{Configs: cs} })
}

// ConfigDetail is a configuration with its revisions (newest first).
type ConfigDetail struct {
	Config    store.ConfigDef  `json:"config"`
	Revisions []store.Revision `json:"revisions"`
}

// ConfigDetail loads a configuration and its revisions (also used by the UI).
func (a *API) ConfigDetail(ctx context.Context, name string) (ConfigDetail, error) {
	c, err := store.GetConfig(ctx, a.o.Store.Pool, name)
	if err != nil {
		return ConfigDetail{}, err
	}
	revs, err := store.Revisions(ctx, a.o.Store.Pool, name)
	if revs == nil {
		revs = []store.Revision{}
	}
	return ConfigDetail{Config: c, Revisions: revs}, err
}

func (a *API) getConfig(w http.ResponseWriter, r *http.Request) {
	d, err := a.ConfigDetail(r.Context(), r.PathValue("name"))
	writeOne(w, d, err, "configuration "+r.PathValue("name"))
}

// PutConfigRequest creates or updates a configuration. Selector uses the
// agents API's syntax: "key=value,key2=value2". (Rollouts started on each
// new revision are a GitOps feature: its index file sets them.)
type PutConfigRequest struct {
	Type     string `json:"type"`
	Selector string `json:"selector"`
	Priority int    `json:"priority"`
}

func (a *API) putConfig(w http.ResponseWriter, r *http.Request) {
	var req PutConfigRequest
	if !a.readJSON(w, r, &req, `{"type": "yaml|myriarch-bridge", "selector": "k=v,...", "priority": 0}`) {
		return
	}
	sel, err := store.ParseSelector(req.Selector)
	if err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	name := r.PathValue("name")
	created, err := a.Configs().Put(r.Context(), store.ConfigDef{Name: name, Type: req.Type, Selector: sel, Priority: req.Priority,
		Source: "api"})
	if err != nil {
		serviceErr(w, err, "configuration "+name)
		return
	}
	d, err := a.ConfigDetail(r.Context(), name)
	if err != nil {
		serviceErr(w, err, "configuration "+name)
		return
	}
	code := storedStatus(created)
	a.o.Log.Info("configuration stored", "config", name, "created", created, "token", TokenName(r.Context()))
	writeJSON(w, code, d)
}

// RevisionRequest adds a revision.
type RevisionRequest struct {
	Content string `json:"content"`
}

// RevisionResult is the answer of POST .../revisions.
type RevisionResult struct {
	Revision store.Revision `json:"revision"`
	// Created is false when the content equals the newest revision.
	Created bool `json:"created"`
}

func (a *API) addRevision(w http.ResponseWriter, r *http.Request) {
	var req RevisionRequest
	if !a.readJSON(w, r, &req, `{"content": "<text>"}`) {
		return
	}
	name := r.PathValue("name")
	rev, created, err := a.Configs().AddRevision(r.Context(), name, req.Content, "token "+TokenName(r.Context()), "")
	if err != nil {
		serviceErr(w, err, "configuration "+name)
		return
	}
	code := storedStatus(created)
	if created {
		a.o.Log.Info("configuration revision stored", "config", name, "revision", rev.Revision, "token", TokenName(r.Context()))
	}
	rev.Content = ""
	writeJSON(w, code, RevisionResult{Revision: rev, Created: created})
}

func pathInt(w http.ResponseWriter, r *http.Request, key string) (int64, bool) {
	n, err := strconv.ParseInt(r.PathValue(key), 10, 64)
	if err != nil || n < 1 {
		writeErr(w, http.StatusBadRequest, fmt.Sprintf("%s %q: must be a positive integer", key, r.PathValue(key)))
		return 0, false
	}
	return n, true
}

func (a *API) getRevision(w http.ResponseWriter, r *http.Request) {
	rev, ok := pathInt(w, r, "rev")
	if !ok {
		return
	}
	x, err := store.GetRevision(r.Context(), a.o.Store.Pool, r.PathValue("name"), int(rev))
	writeOne(w, x, err, fmt.Sprintf("revision %d of %s", rev, r.PathValue("name")))
}

// DiffResult is the answer of GET .../diff.
type DiffResult struct {
	Config string `json:"config"`
	From   int    `json:"from"`
	To     int    `json:"to"`
	// Diff is a unified diff; empty when the revisions are equal.
	Diff string `json:"diff"`
}

// Diff computes the diff between two revisions (also used by the UI);
// revision 0 is the empty document, so 0 → 1 shows the first revision
// whole (configs.RevisionDiff).
func (a *API) Diff(ctx context.Context, name string, from, to int) (DiffResult, error) {
	d, err := a.Configs().RevisionDiff(ctx, name, from, to)
	if err != nil {
		return DiffResult{}, err
	}
	return DiffResult{Config: name, From: from, To: to, Diff: d}, nil
}

func (a *API) diff(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	from, err1 := strconv.Atoi(q.Get("from"))
	to, err2 := strconv.Atoi(q.Get("to"))
	if err1 != nil || err2 != nil || from < 0 || to < 0 {
		writeErr(w, http.StatusBadRequest, fmt.Sprintf("from %q, to %q: both must be revision numbers (0 for the empty document)", q.Get("from"), q.Get("to")))
		return
	}
	d, err := a.Diff(r.Context(), r.PathValue("name"), from, to)
	if err != nil {
		serviceErr(w, err, fmt.Sprintf("such revision of %s (%v)", r.PathValue("name"), err))
		return
	}
	writeJSON(w, http.StatusOK, d)
}

func (a *API) assignment(w http.ResponseWriter, r *http.Request) {
	x, err := store.AgentAssignment(r.Context(), a.o.Store.Pool, r.PathValue("uid"))
	writeOne(w, x, err, "agent "+r.PathValue("uid"))
}

func (a *API) agentIntents(w http.ResponseWriter, r *http.Request) {
	in, err := a.Rollouts().AgentIntents(r.Context(), r.PathValue("uid"), 100)
	writeList(w, in, err, "", intents)
}

// RolloutList is the answer of GET /api/v1/rollouts.
type RolloutList struct {
	Rollouts []rollout.Summary `json:"rollouts"`
}

func (a *API) listRollouts(w http.ResponseWriter, r *http.Request) {
	limit, ok := queryLimit(w, r, "limit", 0, 1000)
	if !ok {
		return
	}
	rs, err := a.Rollouts().List(r.Context(), r.URL.Query().Get("config"), limit)
	writeOne(w, RolloutList{Rollouts: rs}, err, "")
}

func (a *API) createRollout(w http.ResponseWriter, r *http.Request) {
	var req rollout.Request
	if !a.readJSON(w, r, &req, rolloutRequestShape) {
		return
	}
	ro, err := a.Rollouts().Create(r.Context(), req, "token "+TokenName(r.Context()))
	if err != nil {
		serviceErr(w, err, "")
		return
	}
	a.o.Log.Info("rollout created", "rollout", ro.ID, "config", ro.Config, "from", ro.FromRevision, "to", ro.ToRevision, "token", TokenName(r.Context()))
	writeJSON(w, http.StatusAccepted, ro)
}

func (a *API) getRollout(w http.ResponseWriter, r *http.Request) {
	id, ok := pathInt(w, r, "id")
	if !ok {
		return
	}
	limit, ok := queryLimit(w, r, "agents", 1000, 100000)
	if !ok {
		return
	}
	d, err := a.Rollouts().Detail(r.Context(), id, limit)
	writeOne(w, d, err, fmt.Sprintf("rollout %d", id))
}

func (a *API) rolloutIntents(w http.ResponseWriter, r *http.Request) {
	id, ok := pathInt(w, r, "id")
	if !ok {
		return
	}
	in, err := a.Rollouts().Intents(r.Context(), id)
	writeList(w, in, err, fmt.Sprintf("rollout %d", id), intents)
}

func (a *API) rolloutCommand(w http.ResponseWriter, r *http.Request) {
	id, ok := pathInt(w, r, "id")
	if !ok {
		return
	}
	ro, err := a.Rollouts().Command(r.Context(), id, r.PathValue("command"))
	if err != nil {
		serviceErr(w, err, fmt.Sprintf("rollout %d", id))
		return
	}
	a.o.Log.Info("rollout command requested", "rollout", id, "command", r.PathValue("command"), "token", TokenName(r.Context()))
	writeJSON(w, http.StatusAccepted, ro)
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// Store is the API's store (for the UI's pages of configurations).
func (a *API) Store() *store.Store { return a.o.Store }

// GitOpsList is the answer of GET /api/v1/gitops: the status of every Git
// source polled so far.
type GitOpsList struct {
	Sources []gitops.Status `json:"sources"`
}

func (a *API) gitopsStatus(w http.ResponseWriter, r *http.Request) {
	sts, err := gitops.Statuses(r.Context(), a.o.Store.Pool)
	writeList(w, sts, err, "", func(sts []gitops.Status) any { return GitOpsList{Sources: sts} })
}
