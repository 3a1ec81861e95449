// Package ui is myriarchd's web UI: server-rendered pages (html/template)
// with their assets embedded in the binary, so `go build` needs no Node.
//
// The UI uses the API tokens: the login form takes a token, checks it and
// keeps it in an HttpOnly, SameSite=Strict cookie. Every page needs it.
// The pages read, except the agent page's restart and clear-config forms,
// which call the same functions as the REST API.
package ui

import (
	"embed"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"strings"

	"github.com/myriarch/myriarch/internal/fleet/api"
	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

//go:embed templates/*.html static/*
var assets embed.FS

// CookieName holds the API token of a logged-in browser.
const CookieName = "myriarch_session"

var pages = func() map[string]*template.Template {
	funcs := template.FuncMap{"deref": func(b *bool) bool { return b != nil && *b },
		"health": parseHealth, "capnames": store.CapabilityNames,
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
}

type handler struct {
	a   *api.API
	log *slog.Logger
}

// Mount adds the UI under /ui/ to mux (the daemon's Mount hook).
func Mount(mux *http.ServeMux, a *api.API) {
	h := &handler{a: a, log: slog.Default()}
	static, _ := fs.Sub(assets, "static")
	mux.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ui/", http.StatusFound) })
	mux.HandleFunc("GET /ui/login", h.loginForm)
	mux.HandleFunc("POST /ui/login", h.login)
	mux.HandleFunc("POST /ui/logout", h.logout)
	mux.HandleFunc("GET /ui/{$}", h.auth(h.overview))
	mux.HandleFunc("GET /ui/agents", h.auth(h.agents))
	mux.HandleFunc("GET /ui/agents/{uid}", h.auth(h.agent))
	mux.HandleFunc("GET /ui/cluster", h.auth(h.cluster))
	h.mountAgentActions(mux)
	h.mountRollouts(mux)
	h.mountSoftware(mux)
}

func (h *handler) render(w http.ResponseWriter, r *http.Request, name, title string, data any) {
	h.renderRefresh(w, r, name, title, data, false)
}

func (h *handler) renderRefresh(w http.ResponseWriter, r *http.Request, name, title string, data any, refresh bool) {
	ov, _ := h.a.Overview(r.Context())
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'")
	w.Header().Set("X-Frame-Options", "DENY")
	if err := pages[name].ExecuteTemplate(w, "layout", page{Title: title, Nav: name != "login", Replica: ov.ReplicaID, Data: data, Refresh: refresh}); err != nil {
		h.log.Warn("rendering a page failed", "page", name, "error", err)
	}
}

func (h *handler) fail(w http.ResponseWriter, err error) {
	http.Error(w, "myriarchd: "+err.Error(), http.StatusInternalServerError)
}

func (h *handler) auth(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, err := r.Cookie(CookieName)
		if err == nil && c.Value != "" {
			name, err := h.a.Authenticate(r.Context(), c.Value)
			if err != nil {
				h.fail(w, err)
				return
			}
			if name != "" {
				next(w, r)
				return
			}
		}
		http.Redirect(w, r, "/ui/login", http.StatusFound)
	}
}

func (h *handler) loginForm(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, "login", "Log in", struct{ Error string }{})
}

func (h *handler) login(w http.ResponseWriter, r *http.Request) {
	tok := strings.TrimSpace(r.PostFormValue("token"))
	name, err := h.a.Authenticate(r.Context(), tok)
	if err != nil {
		h.fail(w, err)
		return
	}
	if name == "" {
		w.WriteHeader(http.StatusUnauthorized)
		h.render(w, r, "login", "Log in", struct{ Error string }{"Invalid API token."})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: tok, Path: "/ui", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil})
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}

func (h *handler) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/ui", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	ov, err := h.a.Overview(r.Context())
	if err != nil {
		h.fail(w, err)
		return
	}
	h.render(w, r, "overview", "Fleet overview", ov)
}

type agentsData struct {
	Filter   store.Filter
	Selector string
	Agents   []store.Agent
	Next     string
	NextURL  string
	Error    string
}

func (h *handler) agents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := agentsData{Selector: q.Get("selector")}
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
	if errors.Is(err, store.ErrNotFound) {
		http.Error(w, "no agent "+r.PathValue("uid"), http.StatusNotFound)
		return
	}
	if err != nil {
		h.fail(w, err)
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
	h.render(w, r, "agent", title, agentPage{AgentDetail: d, Assignment: as, Intents: in, Notice: notices[r.URL.Query().Get("done")], Error: actionErr})
}

// agentPage is the agent page: the API's detail, the configuration
// assignment and commands, and the outcome of an action (from the redirect
// after it).
type agentPage struct {
	api.AgentDetail
	Assignment    store.Assignment
	Intents       []rollout.Intent
	Notice, Error string
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
