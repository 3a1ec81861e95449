// Package ui is myriarchd's web UI: server-rendered pages (html/template)
// with their assets embedded in the binary, so `go build` needs no Node.
//
// The UI uses the API tokens: the login form takes a token, checks it and
// opens a server-side session; the browser keeps only the session's opaque
// id in an HttpOnly, SameSite=Strict cookie (Secure on TLS). The session
// expires on the server (server.uiSessionTtl), ends on logout and with the
// revocation of its token. Every page needs it, and every page and form
// declares the role it needs (h.route), like the API's endpoints.
//
// Every UI route goes through net/http's CrossOriginProtection, which
// refuses a cross-origin POST (Sec-Fetch-Site, Origin), so a write form
// added later is protected without a change of its own.
package ui

import (
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/api"
	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

//go:embed templates/*.html static/*
var assets embed.FS

// CookieName holds the session id of a logged-in browser.
const CookieName = "myriarch_session"

var pages = func() map[string]*template.Template {
	funcs := template.FuncMap{"deref": func(b *bool) bool { return b != nil && *b },
		"health": parseHealth, "capnames": store.CapabilityNames, "can": can, "bridgeSessions": store.BridgeSessions,
		"selector": configs.FormatSelector, "join": strings.Join,
		"total": func(m map[string]int) int {
			n := 0
			for _, v := range m {
				n += v
			}
			return n
		},
		"secs": func(f *float64) float64 {
			if f == nil {
				return 0
			}
			return *f
		}}
	out := map[string]*template.Template{}
	for _, p := range []string{"login", "overview", "agents", "agent", "cluster", "configs", "config", "rollouts", "rollout", "software"} {
		out[p] = template.Must(template.New(p).Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+p+".html"))
	}
	return out
}()

type page struct {
	Title   string
	Nav     bool
	Replica string
	Data    any
	// Refresh reloads the page every few seconds (a running rollout).
	Refresh bool
	// Role of the session's token: forms it may not use are not shown
	// (the routes refuse them anyway).
	Role store.Role
}

// can reports whether role may use what needs need (templates).
func can(role store.Role, need string) bool { return role.Allows(store.Role(need)) }

type handler struct {
	a      *api.API
	log    *slog.Logger
	mux    *http.ServeMux
	cop    *http.CrossOriginProtection
	routes []api.Route
}

// Mount adds the UI under /ui/ to mux (the daemon's Mount hook).
func Mount(mux *http.ServeMux, a *api.API) { mount(mux, a) }

func mount(mux *http.ServeMux, a *api.API) *handler {
	h := &handler{a: a, log: slog.Default(), mux: mux, cop: http.NewCrossOriginProtection()}
	static, _ := fs.Sub(assets, "static")
	h.public("GET /ui/static/", http.StripPrefix("/ui/static/", http.FileServerFS(static)).ServeHTTP)
	h.public("GET /{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ui/", http.StatusFound) })
	h.public("GET /ui/login", h.loginForm)
	h.public("POST /ui/login", h.login)
	h.public("POST /ui/logout", h.logout)
	h.route(store.RoleViewer, "GET /ui/{$}", h.overview)
	h.route(store.RoleViewer, "GET /ui/agents", h.agents)
	h.route(store.RoleViewer, "GET /ui/agents/{uid}", h.agent)
	h.route(store.RoleViewer, "GET /ui/cluster", h.cluster)
	// The agent page's actions are POST forms; the session cookie is
	// SameSite=Strict and every UI route refuses a cross-origin POST
	// (h.route), so another site cannot submit them.
	h.route(store.RoleOperator, "POST /ui/agents/{uid}/restart", h.restartAgent)
	h.route(store.RoleOperator, "POST /ui/agents/{uid}/clear-config", h.clearConfig)
	h.route(store.RoleAdmin, "POST /ui/agents/{uid}/revoke", h.revokeAgent)
	h.route(store.RoleAdmin, "POST /ui/agents/{uid}/allow-reenroll", h.allowReenroll)
	// The configuration and rollout pages also change state (create,
	// pause, resume, abort, roll back) through the same services as the
	// REST API, as the logged-in token.
	h.route(store.RoleViewer, "GET /ui/configs", h.configs)
	h.route(store.RoleViewer, "GET /ui/configs/{name}", h.config)
	h.route(store.RoleViewer, "GET /ui/rollouts", h.rollouts)
	h.route(store.RoleOperator, "POST /ui/rollouts", h.createRollout)
	h.route(store.RoleOperator, "POST /ui/rollouts/plan", h.planRollout)
	h.route(store.RoleViewer, "GET /ui/rollouts/{id}", h.rollout)
	h.route(store.RoleOperator, "POST /ui/rollouts/{id}/{command}", h.rolloutCommand)
	h.route(store.RoleViewer, "GET /ui/software", h.software)
	return h
}

// Routes lists the UI's routes and the role each needs (api.Public: no
// session), for the role table test.
func Routes() []api.Route { return mount(http.NewServeMux(), nil).routes }

// public registers a route that needs no session, behind the
// cross-origin protection.
func (h *handler) public(pattern string, f http.HandlerFunc) {
	h.routes = append(h.routes, api.Route{Pattern: pattern, Role: api.Public})
	h.mux.Handle(pattern, h.cop.Handler(f))
}

// route registers a page or form for sessions whose token has role,
// behind the cross-origin protection.
func (h *handler) route(role store.Role, pattern string, f http.HandlerFunc) {
	h.routes = append(h.routes, api.Route{Pattern: pattern, Role: role})
	h.mux.Handle(pattern, h.cop.Handler(serverTiming(h.auth(role, f))))
}

// serverTiming sends, as the trailer Server-Timing ("app;dur=" and
// milliseconds), how long the replica took to answer a page from its
// session check to its last byte: the page's own time, without the
// network's (myriarch-loadagents telemetry reports it).
func serverTiming(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		w.Header().Set("Trailer", "Server-Timing")
		next(w, r)
		w.Header().Set("Server-Timing", "app;dur="+strconv.FormatFloat(float64(time.Since(start).Microseconds())/1000, 'f', 1, 64))
	}
}

func (h *handler) render(w http.ResponseWriter, r *http.Request, name, title string, data any) {
	h.renderRefresh(w, r, name, title, data, false)
}

func (h *handler) renderRefresh(w http.ResponseWriter, r *http.Request, name, title string, data any, refresh bool) {
	ov, _ := h.a.Overview(r.Context())
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'")
	w.Header().Set("X-Frame-Options", "DENY")
	if err := pages[name].ExecuteTemplate(w, "layout", page{Title: title, Nav: name != "login", Replica: ov.ReplicaID, Data: data, Role: api.TokenRole(r.Context()), Refresh: refresh}); err != nil {
		h.log.Warn("rendering a page failed", "page", name, "error", err)
	}
}

func (h *handler) fail(w http.ResponseWriter, err error) {
	http.Error(w, "myriarchd: "+err.Error(), http.StatusInternalServerError)
}

// failed answers the error of reading what ("agent X"): 404 "no "+what
// for an unknown one, the error page otherwise; it tells whether err was
// one.
func (h *handler) failed(w http.ResponseWriter, err error, what string) bool {
	switch {
	case errors.Is(err, store.ErrNotFound):
		http.Error(w, "no "+what, http.StatusNotFound)
	case err != nil:
		h.fail(w, err)
	}
	return err != nil
}

func (h *handler) auth(role store.Role, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, err := r.Cookie(CookieName)
		if err != nil || c.Value == "" {
			http.Redirect(w, r, "/ui/login", http.StatusFound)
			return
		}
		r, cancel := h.a.WithDeadline(r)
		defer cancel()
		t, err := h.a.Session(r.Context(), h.a.Source(r), c.Value)
		switch {
		case errors.Is(err, api.ErrInvalidToken):
			http.Redirect(w, r, "/ui/login", http.StatusFound)
			return
		case errors.Is(err, api.ErrTooManyFailures):
			w.Header().Set("Retry-After", h.a.RetryAfter())
			http.Error(w, "myriarchd: "+err.Error(), http.StatusTooManyRequests)
			return
		case err != nil:
			http.Error(w, "myriarchd: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		if !t.Role.Allows(role) {
			http.Error(w, fmt.Sprintf("myriarchd: this action needs role %s; you are logged in with token %q of role %s", role, t.Name, t.Role), http.StatusForbidden)
			return
		}
		if err := api.CheckRequestText(r); err != nil {
			http.Error(w, "myriarchd: "+err.Error(), http.StatusBadRequest)
			return
		}
		next(w, r.WithContext(api.WithToken(r.Context(), t)))
	}
}

func (h *handler) loginForm(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, "login", "Log in", struct{ Error string }{})
}

func (h *handler) login(w http.ResponseWriter, r *http.Request) {
	r, cancel := h.a.WithDeadline(r)
	defer cancel()
	tok := strings.TrimSpace(r.PostFormValue("token"))
	t, err := h.a.Check(r.Context(), h.a.Source(r), tok)
	switch {
	case errors.Is(err, api.ErrInvalidToken):
		w.WriteHeader(http.StatusUnauthorized)
		h.render(w, r, "login", "Log in", struct{ Error string }{"Invalid API token."})
		return
	case errors.Is(err, api.ErrTooManyFailures):
		w.Header().Set("Retry-After", h.a.RetryAfter())
		w.WriteHeader(http.StatusTooManyRequests)
		h.render(w, r, "login", "Log in", struct{ Error string }{"Too many failed logins from this address; wait a moment and retry."})
		return
	case err != nil:
		http.Error(w, "myriarchd: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	id, ttl, err := h.a.OpenSession(r.Context(), t)
	if err != nil {
		h.log.Warn("opening a UI session failed", "error", err)
		http.Error(w, "myriarchd: opening a session failed; retry later", http.StatusServiceUnavailable)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: id, Path: "/ui", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil, MaxAge: int(ttl.Seconds())})
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}

func (h *handler) logout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(CookieName); err == nil && c.Value != "" {
		if err := h.a.CloseSession(r.Context(), c.Value); err != nil {
			h.log.Warn("ending a UI session failed", "error", err)
		}
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/ui", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil})
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	ov, err := h.a.Overview(r.Context())
	if err != nil {
		h.fail(w, err)
		return
	}
	h.render(w, r, "overview", "Fleet overview", overviewPage{Overview: ov, Pictures: h.fleetPictures(r.Context())})
}

// overviewPage is the overview with its pictures (telemetry.go).
type overviewPage struct {
	api.Overview
	Pictures *fleetPictures
}

type agentsData struct {
	// Sparks are the agents' throughput sparklines (telemetry.go).
	Sparks   map[string]template.HTML
	Filter   store.Filter
	Selector string
	// Roles are the choices of the session role filter.
	Roles   []string
	Agents  []store.Agent
	Next    string
	NextURL string
	Error   string
}

func (h *handler) agents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := agentsData{Selector: q.Get("selector"), Roles: store.SessionRoles}
	f, err := api.ParseFilter(q)
	d.Filter = f
	if err != nil {
		d.Error = err.Error()
		h.render(w, r, "agents", "Agents", d)
		return
	}
	if f.Limit == 0 {
		f.Limit = 50
	}
	list, err := h.a.ListAgents(r.Context(), f)
	if err != nil {
		h.fail(w, err)
		return
	}
	d.Agents, d.Next = list.Agents, list.Next
	d.Sparks = h.agentSparks(r.Context(), d.Agents)
	if d.Next != "" {
		nq := url.Values{}
		for k, v := range q {
			nq[k] = v
		}
		nq.Set("after", d.Next)
		d.NextURL = "/ui/agents?" + nq.Encode()
	}
	h.render(w, r, "agents", "Agents", d)
}

func (h *handler) agent(w http.ResponseWriter, r *http.Request) { h.agentPage(w, r, "") }

// agentPage renders the agent page, with the error of a refused action.
func (h *handler) agentPage(w http.ResponseWriter, r *http.Request, actionErr string) {
	d, err := h.a.AgentDetail(r.Context(), r.PathValue("uid"))
	if h.failed(w, err, "agent "+r.PathValue("uid")) {
		return
	}
	title := "Agent " + d.Agent.InstanceUID
	if n := d.Agent.Identifying["service.name"]; n != "" {
		title = "Agent " + n + " (" + d.Agent.InstanceUID + ")"
	}
	as, err := store.AgentAssignment(r.Context(), h.a.Store().Pool, d.Agent.InstanceUID)
	if err != nil {
		h.fail(w, err)
		return
	}
	in, err := h.a.Rollouts().AgentIntents(r.Context(), d.Agent.InstanceUID, 20)
	if err != nil {
		h.fail(w, err)
		return
	}
	h.render(w, r, "agent", title, agentPage{AgentDetail: d, Assignment: as, Intents: in, Notice: notices[r.URL.Query().Get("done")], Error: actionErr,
		Telemetry: h.agentTelemetry(r.Context(), d.Agent.InstanceUID)})
}

// agentPage is the agent page: the API's detail, its configuration
// assignment and rollout intents, and the outcome of an action (from the
// redirect after it).
type agentPage struct {
	api.AgentDetail
	Assignment    store.Assignment
	Intents       []rollout.Intent
	Notice, Error string
	// Telemetry are the charts of its own metrics (nil: telemetry off).
	Telemetry *agentCharts
}

func (h *handler) cluster(w http.ResponseWriter, r *http.Request) {
	c, err := h.a.Cluster(r.Context())
	if err != nil {
		h.fail(w, err)
		return
	}
	sort.SliceStable(c.Replicas, func(i, j int) bool { return c.Replicas[i].ID < c.Replicas[j].ID })
	h.render(w, r, "cluster", "Cluster", c)
}
