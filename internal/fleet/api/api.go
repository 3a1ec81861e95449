// Package api is myriarchd's REST API (JSON under /api/v1) and its
// unauthenticated probe and metrics endpoints.
//
// Every /api/v1 request needs an API token (Authorization: Bearer myr_...)
// created with `myriarchd token create`; the database stores only its
// SHA-256 hash. /healthz, /readyz and /metrics need none and write nothing.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/myriarch/myriarch/internal/fleet/jobs"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/pgleader"
)

// Cluster is what the API shows about the HA state (pgleader.Elector).
type Cluster interface {
	ID() string
	IsLeader() bool
	LockKey() int64
	Replicas(ctx context.Context) ([]pgleader.Replica, error)
}

// Options configure the API.
type Options struct {
	Store   *store.Store
	Cluster Cluster
	// Jobs returns this replica's view of the leader jobs.
	Jobs func() []jobs.Status
	// Ready returns nil when this replica can serve (readiness probe).
	Ready    func(ctx context.Context) error
	Gatherer prometheus.Gatherer
	Log      *slog.Logger
	// MaxConfigBytes bounds a remote config; default 1 MiB.
	MaxConfigBytes int64
}

// API serves the endpoints.
type API struct{ o Options }

// New returns the API.
func New(o Options) *API {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.MaxConfigBytes == 0 {
		o.MaxConfigBytes = 1 << 20
	}
	return &API{o: o}
}

// Register adds the endpoints to mux.
func (a *API) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		if a.o.Ready != nil {
			if err := a.o.Ready(ctx); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		w.Write([]byte("ready\n"))
	})
	if a.o.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(a.o.Gatherer, promhttp.HandlerOpts{}))
	}
	mux.Handle("GET /api/v1/overview", a.auth(a.overview))
	mux.Handle("GET /api/v1/agents", a.auth(a.listAgents))
	mux.Handle("GET /api/v1/agents/{uid}", a.auth(a.getAgent))
	mux.Handle("PUT /api/v1/agents/{uid}/config", a.auth(a.setConfig))
	a.registerAgentCommands(mux)
	a.registerPackages(mux)
	mux.Handle("GET /api/v1/cluster", a.auth(a.cluster))
	mux.Handle("GET /api/v1/tokens", a.auth(a.listTokens))
	mux.Handle("DELETE /api/v1/tokens/{id}", a.auth(a.revokeToken))
	a.registerConfigs(mux)
	mux.Handle("/api/", a.auth(func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, http.StatusNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path)
	}))
}

// Authenticate returns the token name of a valid token, or "" for an
// unknown or revoked one. It asks the database every time, so a revoked
// token is refused at once on every replica.
func (a *API) Authenticate(ctx context.Context, tok string) (string, error) {
	t, ok, err := a.o.Store.CheckToken(ctx, tok)
	if !ok {
		return "", err
	}
	return t.Name, nil
}

type ctxKey struct{}

// TokenName is the name of the token that authenticated the request.
func TokenName(ctx context.Context) string { t, _ := ctx.Value(ctxKey{}).(store.Token); return t.Name }

// tokenRef names the token of the request for logs and revoked_by.
func tokenRef(ctx context.Context) string {
	t, _ := ctx.Value(ctxKey{}).(store.Token)
	return fmt.Sprintf("token %s (id %d)", t.Name, t.ID)
}

func (a *API) auth(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || tok == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="myriarchd"`)
			writeErr(w, http.StatusUnauthorized, "an API token is required (Authorization: Bearer <token>; create one with `myriarchd token create`)")
			return
		}
		t, ok, err := a.o.Store.CheckToken(r.Context(), tok)
		if err != nil {
			writeErr(w, http.StatusServiceUnavailable, "checking the token failed: "+err.Error())
			return
		}
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="myriarchd", error="invalid_token"`)
			writeErr(w, http.StatusUnauthorized, "invalid API token (unknown or revoked)")
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, t)))
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeErr(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

// Overview is the fleet overview.
type Overview struct {
	Counts    store.Counts `json:"agents"`
	ReplicaID string       `json:"replica_id"`
	Leader    *LeaderInfo  `json:"leader"`
}

// LeaderInfo is the current leader.
type LeaderInfo struct {
	ID        string    `json:"id"`
	Term      int64     `json:"term"`
	ElectedAt time.Time `json:"elected_at"`
	// Active is true when the recorded leader's lock session holds the lock.
	Active bool `json:"active"`
}

func (a *API) overview(w http.ResponseWriter, r *http.Request) {
	o, err := a.Overview(r.Context())
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, o)
}

// Overview gathers the fleet overview (also used by the UI).
func (a *API) Overview(ctx context.Context) (Overview, error) {
	c, err := a.o.Store.Counts(ctx)
	if err != nil {
		return Overview{}, err
	}
	l, err := a.leader(ctx, nil)
	return Overview{Counts: c, ReplicaID: a.o.Cluster.ID(), Leader: l}, err
}

func (a *API) leader(ctx context.Context, reps []pgleader.Replica) (*LeaderInfo, error) {
	l, ok, err := a.o.Store.CurrentLeader(ctx, pgleader.TermTable, a.o.Cluster.LockKey())
	if err != nil || !ok {
		return nil, err
	}
	if reps == nil {
		if reps, err = a.o.Cluster.Replicas(ctx); err != nil {
			return nil, err
		}
	}
	info := &LeaderInfo{ID: l.LeaderID, Term: l.Term, ElectedAt: l.ElectedAt}
	for _, r := range reps {
		if r.ID == l.LeaderID && r.HoldsLock {
			info.Active = true
		}
	}
	return info, nil
}

// AgentList is a page of agents.
type AgentList struct {
	Agents []store.Agent `json:"agents"`
	// Next is the cursor of the next page (query parameter after); empty at the end.
	Next string `json:"next"`
}

// ParseFilter reads the list filters from a query.
func ParseFilter(q map[string][]string) (store.Filter, error) {
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	f := store.Filter{Status: get("status"), Replica: get("replica"), After: get("after")}
	if f.Status != "" && f.Status != "online" && f.Status != "offline" {
		return f, errors.New("status: must be online or offline")
	}
	if l := get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			return f, errors.New("limit: must be an integer within [1, 1000]")
		}
		f.Limit = n
	}
	sel, err := store.ParseSelector(get("selector"))
	if err != nil {
		return f, err
	}
	f.Selector = sel
	return f, nil
}

func (a *API) listAgents(w http.ResponseWriter, r *http.Request) {
	f, err := ParseFilter(r.URL.Query())
	if err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	list, err := a.ListAgents(r.Context(), f)
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, list)
}

// ListAgents returns a page of agents (also used by the UI).
func (a *API) ListAgents(ctx context.Context, f store.Filter) (AgentList, error) {
	agents, next, err := a.o.Store.ListAgents(ctx, f)
	if agents == nil {
		agents = []store.Agent{}
	}
	return AgentList{Agents: agents, Next: next}, err
}

// AgentDetail is one agent with its newest events.
type AgentDetail struct {
	Agent  store.Agent   `json:"agent"`
	Events []store.Event `json:"events"`
}

func (a *API) getAgent(w http.ResponseWriter, r *http.Request) {
	d, err := a.AgentDetail(r.Context(), r.PathValue("uid"))
	if errors.Is(err, store.ErrNotFound) {
		writeErr(w, http.StatusNotFound, "no agent "+r.PathValue("uid"))
		return
	}
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// AgentDetail loads an agent and its events (also used by the UI).
func (a *API) AgentDetail(ctx context.Context, uid string) (AgentDetail, error) {
	ag, err := a.o.Store.GetAgent(ctx, uid)
	if err != nil {
		return AgentDetail{}, err
	}
	evs, err := a.o.Store.Events(ctx, uid, 100)
	if evs == nil {
		evs = []store.Event{}
	}
	return AgentDetail{Agent: ag, Events: evs}, err
}

// ConfigRequest sets an agent's remote config.
type ConfigRequest struct {
	Config string `json:"config"`
}

func (a *API) setConfig(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, a.o.MaxConfigBytes+1))
	if err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	if int64(len(body)) > a.o.MaxConfigBytes {
		writeErr(w, http.StatusRequestEntityTooLarge, "config: larger than "+strconv.FormatInt(a.o.MaxConfigBytes, 10)+" bytes")
		return
	}
	var req ConfigRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeErr(w, http.StatusBadRequest, `body: must be JSON {"config": "<text>"}: `+err.Error())
		return
	}
	uid := r.PathValue("uid")
	hash, err := a.o.Store.SetDesiredConfig(r.Context(), uid, req.Config)
	if errors.Is(err, store.ErrNotFound) {
		writeErr(w, http.StatusNotFound, "no agent "+uid)
		return
	}
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	a.o.Log.Info("remote config set", "agent", uid, "hash", hash, "token", TokenName(r.Context()))
	writeJSON(w, http.StatusAccepted, map[string]string{"instance_uid": uid, "config_hash": hash,
		"status": "stored; delivered to the agent by the replica it is connected to"})
}

// ReplicaInfo is one registry row.
type ReplicaInfo struct {
	ID            string    `json:"id"`
	Host          string    `json:"host"`
	Version       string    `json:"version"`
	StartedAt     time.Time `json:"started_at"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	AgeS          float64   `json:"heartbeat_age_s"`
	IsLeader      bool      `json:"is_leader"`
	HoldsLock     bool      `json:"holds_lock"`
	Stale         bool      `json:"stale"`
}

// ClusterInfo is the cluster page.
type ClusterInfo struct {
	ReplicaID        string         `json:"replica_id"`
	ThisReplicaLeads bool           `json:"this_replica_leads"`
	Leader           *LeaderInfo    `json:"leader"`
	Replicas         []ReplicaInfo  `json:"replicas"`
	Jobs             []jobs.Status  `json:"jobs"`
	JobRuns          []store.JobRun `json:"job_runs"`
}

func (a *API) cluster(w http.ResponseWriter, r *http.Request) {
	c, err := a.Cluster(r.Context())
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, c)
}

// Cluster gathers the cluster view (also used by the UI).
func (a *API) Cluster(ctx context.Context) (ClusterInfo, error) {
	reps, err := a.o.Cluster.Replicas(ctx)
	if err != nil {
		return ClusterInfo{}, err
	}
	l, err := a.leader(ctx, reps)
	if err != nil {
		return ClusterInfo{}, err
	}
	runs, err := a.o.Store.JobRuns(ctx)
	if err != nil {
		return ClusterInfo{}, err
	}
	c := ClusterInfo{ReplicaID: a.o.Cluster.ID(), ThisReplicaLeads: a.o.Cluster.IsLeader(), Leader: l, JobRuns: runs, Replicas: []ReplicaInfo{}}
	if c.JobRuns == nil {
		c.JobRuns = []store.JobRun{}
	}
	for _, r := range reps {
		c.Replicas = append(c.Replicas, ReplicaInfo{ID: r.ID, Host: r.Host, Version: r.Version, StartedAt: r.StartedAt,
			LastHeartbeat: r.LastHeartbeat, AgeS: r.Age.Seconds(), IsLeader: r.IsLeader, HoldsLock: r.HoldsLock, Stale: r.Stale})
	}
	if a.o.Jobs != nil {
		c.Jobs = a.o.Jobs()
	}
	return c, nil
}

// TokenList is the answer of GET /api/v1/tokens.
type TokenList struct {
	Tokens []store.Token `json:"tokens"`
}

func (a *API) listTokens(w http.ResponseWriter, r *http.Request) {
	status := r.URL.Query().Get("status")
	if status != store.TokensAll && status != store.TokensActive && status != store.TokensRevoked {
		writeErr(w, http.StatusBadRequest, "status: must be active or revoked")
		return
	}
	toks, err := a.o.Store.ListTokens(r.Context(), status)
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	if toks == nil {
		toks = []store.Token{}
	}
	writeJSON(w, http.StatusOK, TokenList{Tokens: toks})
}

// Revocation is the answer of DELETE /api/v1/tokens/{id}.
type Revocation struct {
	Token store.Token `json:"token"`
	// Revoked is false when the token had been revoked before.
	Revoked bool `json:"revoked"`
}

func (a *API) revokeToken(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		writeErr(w, http.StatusBadRequest, "id: must be a positive integer (the id that `myriarchd token list` shows)")
		return
	}
	t, revoked, err := a.o.Store.RevokeToken(r.Context(), id, tokenRef(r.Context()))
	if errors.Is(err, store.ErrNotFound) {
		writeErr(w, http.StatusNotFound, "no token "+r.PathValue("id"))
		return
	}
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	if revoked {
		a.o.Log.Info("API token revoked", "id", t.ID, "name", t.Name, "by", t.RevokedBy)
	}
	writeJSON(w, http.StatusOK, Revocation{Token: t, Revoked: revoked})
}
