// Package api is myriarchd's REST API (JSON under /api/v1) and its
// unauthenticated probe and metrics endpoints.
//
// Every /api/v1 request needs an API token (Authorization: Bearer myr_...)
// created with `myriarchd token create`; the database stores only its
// SHA-256 hash. /healthz, /readyz and /metrics need none and write nothing.
//
// Every endpoint declares the role it needs where it is registered
// (a.route); Routes lists them, and the role table test walks that list,
// so an endpoint added later is covered without a change to the test.
// A source address whose tokens failed too often is slowed down
// (authlimit.Guard): its checks run one at a time and a failed one is
// answered 429 after a penalty, while a valid token from the same address
// is still accepted. Behind trusted proxies the source is the client they
// name. Every /api/v1 request, token check included, runs under
// RequestTimeout: in a database outage it is answered 503 by then.
// Unauthenticated callers never see an internal error text: it goes to
// the log.
package api

import (
	"bytes"
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

	"github.com/myriarch/myriarch/internal/fleet/authlimit"
	"github.com/myriarch/myriarch/internal/fleet/jobs"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/fleet/telemetry"
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
	// AuthFailuresPerMinute is the failed authentications per source
	// address and minute before the source is refused unchecked; default 30.
	AuthFailuresPerMinute int64
	// SessionTTL is the lifetime of a UI session; default 12h.
	SessionTTL time.Duration
	// Proxies are the trusted load balancers (server.trustedProxies).
	Proxies *authlimit.Proxies
	// AuthFailurePenalty: see authlimit.Guard; default 1s.
	AuthFailurePenalty time.Duration
	// RequestTimeout is the deadline of an API or UI request, its token or
	// session check included; default 5s.
	RequestTimeout time.Duration
	// Telemetry reads the agents' own metrics; nil: telemetry is off.
	Telemetry *telemetry.Reader
}

// API serves the endpoints.
type API struct {
	o      Options
	guard  *authlimit.Guard
	routes []Route
}

// New returns the API.
func New(o Options) *API {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.MaxConfigBytes == 0 {
		o.MaxConfigBytes = 1 << 20
	}
	if o.SessionTTL == 0 {
		o.SessionTTL = 12 * time.Hour
	}
	if o.AuthFailuresPerMinute == 0 {
		o.AuthFailuresPerMinute = 30
	}
	if o.AuthFailurePenalty == 0 {
		o.AuthFailurePenalty = time.Second
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = 5 * time.Second
	}
	return &API{o: o, guard: authlimit.NewGuard(o.AuthFailuresPerMinute, o.AuthFailurePenalty)}
}

// Public is the Role of the endpoints that need no token.
const Public store.Role = "public"

// Route is one registered endpoint and the role it needs.
type Route struct {
	Pattern string
	Role    store.Role
}

// Routes lists the registered endpoints (after Register).
func (a *API) Routes() []Route { return a.routes }

// route registers h for pattern behind the API token check, for tokens
// whose role allows role. Every /api/ endpoint is registered through it.
func (a *API) route(mux *http.ServeMux, role store.Role, pattern string, h http.HandlerFunc) {
	if _, err := store.ParseRole(string(role)); err != nil {
		panic("api: route " + pattern + ": " + err.Error())
	}
	a.routes = append(a.routes, Route{Pattern: pattern, Role: role})
	mux.Handle(pattern, a.auth(role, h))
}

// public registers an endpoint that needs no token.
func (a *API) public(mux *http.ServeMux, pattern string, h http.Handler) {
	a.routes = append(a.routes, Route{Pattern: pattern, Role: Public})
	mux.Handle(pattern, h)
}

// Register adds the endpoints to mux.
func (a *API) Register(mux *http.ServeMux) {
	a.public(mux, "GET /healthz", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	}))
	a.public(mux, "GET /readyz", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		if a.o.Ready != nil {
			if err := a.o.Ready(ctx); err != nil {
				// The reason is for the operator's log, not for whoever asks.
				a.o.Log.Warn("readiness check failed", "error", err)
				http.Error(w, "not ready", http.StatusServiceUnavailable)
				return
			}
		}
		w.Write([]byte("ready\n"))
	}))
	if a.o.Gatherer != nil {
		a.public(mux, "GET /metrics", promhttp.HandlerFor(a.o.Gatherer, promhttp.HandlerOpts{}))
	}
	// The document describes the API's shape, which is no secret (it is
	// in the source): tools fetch it before they hold a token.
	a.public(mux, "GET /api/v1/openapi.json", http.HandlerFunc(a.serveOpenAPI))
	for _, e := range a.endpoints() {
		a.route(mux, e.role, e.pattern, e.h)
	}
}

// Authentication outcomes of Check besides success.
var (
	// ErrInvalidToken: unknown or revoked.
	ErrInvalidToken = errors.New("invalid API token (unknown or revoked)")
	// ErrTooManyFailures: the source failed too often and this check
	// failed too, or did not get its turn before the deadline.
	ErrTooManyFailures = errors.New("too many failed authentications from this address; slow down")
	// ErrUnavailable: the check itself failed (database); the cause is logged.
	ErrUnavailable = errors.New("the token check is unavailable; retry later")
)

// Check authenticates token tok presented by source (a.Source): it asks
// the database every time, so a revoked token is refused at once on every
// replica. A source that failed too often is slowed (authlimit.Guard).
func (a *API) Check(ctx context.Context, source, tok string) (store.Token, error) {
	return a.guarded(ctx, source, tok, "checking an API token failed", a.o.Store.CheckToken)
}

// guarded runs a token or session check through the failure guard.
func (a *API) guarded(ctx context.Context, source, cred, failMsg string, check func(context.Context, string) (store.Token, bool, error)) (store.Token, error) {
	var t store.Token
	ok, err := a.guard.Check(ctx, source, cred, func(ctx context.Context) (bool, error) {
		var ok bool
		var err error
		t, ok, err = check(ctx, cred)
		return ok, err
	})
	switch {
	case errors.Is(err, authlimit.ErrSlowedDown):
		return store.Token{}, ErrTooManyFailures
	case err != nil:
		a.o.Log.Warn(failMsg, "error", err)
		return store.Token{}, ErrUnavailable
	case !ok:
		return store.Token{}, ErrInvalidToken
	}
	return t, nil
}

// Source is the source address of r that failures are counted on: the
// client named by a trusted proxy, else the peer.
func (a *API) Source(r *http.Request) string { return a.o.Proxies.Source(r) }

// RetryAfter is the Retry-After of ErrTooManyFailures.
func (a *API) RetryAfter() string { return a.guard.RetryAfter() }

// WithDeadline returns r under the request deadline (RequestTimeout) and
// its cancel function: the token or session check and the handler share
// it.
func (a *API) WithDeadline(r *http.Request) (*http.Request, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(r.Context(), a.o.RequestTimeout)
	return r.WithContext(ctx), cancel
}

// Authenticate returns the token name of a valid token, or "" for an
// unknown or revoked one.
func (a *API) Authenticate(ctx context.Context, tok string) (string, error) {
	t, ok, err := a.o.Store.CheckToken(ctx, tok)
	if !ok {
		return "", err
	}
	return t.Name, nil
}

// WithToken returns ctx carrying t as the request's token (the UI).
func WithToken(ctx context.Context, t store.Token) context.Context {
	return context.WithValue(ctx, ctxKey{}, t)
}

type ctxKey struct{}

// TokenName is the name of the token that authenticated the request.
func TokenName(ctx context.Context) string { t, _ := ctx.Value(ctxKey{}).(store.Token); return t.Name }

// tokenRef names the token of the request for logs and revoked_by.
func tokenRef(ctx context.Context) string {
	t, _ := ctx.Value(ctxKey{}).(store.Token)
	return fmt.Sprintf("token %s (id %d)", t.Name, t.ID)
}

// TokenRole is the role of the token that authenticated the request.
func TokenRole(ctx context.Context) store.Role {
	t, _ := ctx.Value(ctxKey{}).(store.Token)
	return t.Role
}

func (a *API) auth(role store.Role, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || tok == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="myriarchd"`)
			writeErr(w, http.StatusUnauthorized, "an API token is required (Authorization: Bearer <token>; create one with `myriarchd token create`)")
			return
		}
		r, cancel := a.WithDeadline(r)
		defer cancel()
		t, err := a.Check(r.Context(), a.Source(r), tok)
		switch {
		case errors.Is(err, ErrTooManyFailures):
			w.Header().Set("Retry-After", a.RetryAfter())
			writeErr(w, http.StatusTooManyRequests, err.Error())
			return
		case errors.Is(err, ErrInvalidToken):
			w.Header().Set("WWW-Authenticate", `Bearer realm="myriarchd", error="invalid_token"`)
			writeErr(w, http.StatusUnauthorized, err.Error())
			return
		case err != nil:
			writeErr(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		if !t.Role.Allows(role) {
			writeErr(w, http.StatusForbidden, fmt.Sprintf("%s %s needs role %s; token %q has role %s", r.Method, r.URL.Path, role, t.Name, t.Role))
			return
		}
		// After the token check: a caller without one learns nothing
		// about the parameters.
		if err := CheckRequestText(r); err != nil {
			writeErr(w, http.StatusBadRequest, err.Error())
			return
		}
		h(w, r.WithContext(WithToken(r.Context(), t)))
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// writeErr answers an error (ErrorBody). A refused request (400, 422)
// whose message locates problems in content ("config:12: routes[0].x:
// ...") also lists them in problems, so that a client can point at the
// file and line it sent.
// agentErr answers the error of an operation on agent uid (404 for an
// unknown agent, 500 otherwise) and tells whether there was one.
func agentErr(w http.ResponseWriter, uid string, err error) bool {
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeErr(w, http.StatusNotFound, "no agent "+uid)
	case err != nil:
		writeErr(w, http.StatusInternalServerError, err.Error())
	}
	return err != nil
}

func writeErr(w http.ResponseWriter, code int, msg string) {
	b := ErrorBody{Error: msg}
	if code == http.StatusBadRequest || code == http.StatusUnprocessableEntity {
		b.Problems = problemsOf(msg)
	}
	writeJSON(w, code, b)
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
	l, ok, err := a.o.Store.CurrentLeader(ctx, a.o.Cluster.LockKey())
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
	f := store.Filter{Status: get("status"), Replica: get("replica"), After: get("after"), BridgeID: get("bridge_id"), Role: get("role")}
	if f.Status != "" && f.Status != "online" && f.Status != "offline" {
		return f, errors.New("status: must be online or offline")
	}
	if f.Role != "" && !store.IsSessionRole(f.Role) {
		return f, fmt.Errorf("role: %q: must be one of %s", f.Role, strings.Join(store.SessionRoles, ", "))
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
	return withKind(q, f)
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
	if agentErr(w, r.PathValue("uid"), err) {
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
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		writeErr(w, http.StatusRequestEntityTooLarge, "body: larger than server.maxRequestBytes ("+strconv.FormatInt(mbe.Limit, 10)+" bytes)")
		return
	}
	if err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	if int64(len(body)) > a.o.MaxConfigBytes {
		writeErr(w, http.StatusRequestEntityTooLarge, "config: larger than "+strconv.FormatInt(a.o.MaxConfigBytes, 10)+" bytes")
		return
	}
	req, err := parseConfigRequest(body)
	if err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	uid := r.PathValue("uid")
	if err := a.checkAgentConfig(r.Context(), uid, req.Config); err != nil {
		var inv *InvalidConfigError
		switch {
		case errors.Is(err, store.ErrNotFound):
			writeErr(w, http.StatusNotFound, "no agent "+uid)
		case errors.As(err, &inv):
			writeErr(w, http.StatusUnprocessableEntity, "config: "+err.Error())
		default:
			writeErr(w, http.StatusInternalServerError, err.Error())
		}
		return
	}
	hash, err := a.o.Store.SetDesiredConfigBy(r.Context(), uid, req.Config, "token "+TokenName(r.Context()))
	if agentErr(w, uid, err) {
		return
	}
	a.o.Log.Info("remote config set", "agent", uid, "hash", hash, "token", TokenName(r.Context()))
	writeJSON(w, http.StatusAccepted, map[string]string{"instance_uid": uid, "config_hash": hash,
		"status": "stored; delivered to the agent by the replica it is connected to"})
}

// parseConfigRequest decodes the body of PUT .../config: one JSON object
// with the string field config and nothing else.
func parseConfigRequest(body []byte) (ConfigRequest, error) {
	var req ConfigRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, fmt.Errorf(`body: must be JSON {"config": "<text>"}: %w`, err)
	}
	if dec.More() {
		return req, errors.New(`body: must be one JSON object {"config": "<text>"}, found more after it`)
	}
	return req, checkJSONText(body)
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
