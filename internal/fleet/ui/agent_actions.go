package ui

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"sort"

	"github.com/myriarch/myriarch/internal/fleet/api"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// mountAgentActions adds the agent page's two actions. They are POST
// forms; the session cookie is SameSite=Strict and a cross-origin Origin
// is refused, so another site cannot submit them.
func (h *handler) mountAgentActions(mux *http.ServeMux) {
	mux.HandleFunc("POST /ui/agents/{uid}/restart", h.auth(h.sameOrigin(h.restartAgent)))
	mux.HandleFunc("POST /ui/agents/{uid}/clear-config", h.auth(h.sameOrigin(h.clearConfig)))
}

func (h *handler) sameOrigin(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if o := r.Header.Get("Origin"); o != "" {
			if u, err := url.Parse(o); err != nil || u.Host != r.Host {
				http.Error(w, "cross-origin request refused", http.StatusForbidden)
				return
			}
		}
		next(w, r)
	}
}

// notices are the outcomes an action redirects to (?done=...); a code,
// not free text, so that a link cannot put words on the page.
var notices = map[string]string{
	"restart": "Restart requested; the replica the agent is connected to sends it.",
	"cleared": "Desired config cleared; the agent is sent an empty config.",
}

// backToAgent redirects to the agent's page with a notice.
func backToAgent(w http.ResponseWriter, r *http.Request, done string) {
	http.Redirect(w, r, "/ui/agents/"+url.PathEscape(r.PathValue("uid"))+"?done="+done, http.StatusSeeOther)
}

func (h *handler) restartAgent(w http.ResponseWriter, r *http.Request) {
	err := h.a.RestartAgent(r.Context(), r.PathValue("uid"))
	switch {
	case errors.Is(err, store.ErrNotFound):
		http.Error(w, "no agent "+r.PathValue("uid"), http.StatusNotFound)
	case errors.Is(err, api.ErrCannotRestart):
		w.WriteHeader(http.StatusConflict)
		h.agentPage(w, r, err.Error())
	case err != nil:
		h.fail(w, err)
	default:
		h.log.Info("agent restart requested from the UI", "agent", r.PathValue("uid"))
		backToAgent(w, r, "restart")
	}
}

func (h *handler) clearConfig(w http.ResponseWriter, r *http.Request) {
	_, err := h.a.ClearConfig(r.Context(), r.PathValue("uid"))
	switch {
	case errors.Is(err, store.ErrNotFound):
		http.Error(w, "no agent "+r.PathValue("uid"), http.StatusNotFound)
	case err != nil:
		h.fail(w, err)
	default:
		h.log.Info("remote config cleared from the UI", "agent", r.PathValue("uid"))
		backToAgent(w, r, "cleared")
	}
}

// component is one node of an agent's component health, for the
// template (opampserver stores it as nested JSON).
type component struct {
	Name       string
	Healthy    bool        `json:"healthy"`
	Status     string      `json:"status"`
	LastError  string      `json:"last_error"`
	Components []component `json:"-"`
}

// parseHealth turns the stored health JSON into a sorted tree; nil when
// there is none.
func parseHealth(raw json.RawMessage) *component {
	if len(raw) == 0 {
		return nil
	}
	var n healthJSON
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil
	}
	c := n.tree("")
	return &c
}

type healthJSON struct {
	Healthy    bool                   `json:"healthy"`
	Status     string                 `json:"status"`
	LastError  string                 `json:"last_error"`
	Components map[string]*healthJSON `json:"components"`
}

func (n *healthJSON) tree(name string) component {
	c := component{Name: name, Healthy: n.Healthy, Status: n.Status, LastError: n.LastError}
	for k, v := range n.Components {
		if v != nil {
			c.Components = append(c.Components, v.tree(k))
		}
	}
	sort.Slice(c.Components, func(i, j int) bool { return c.Components[i].Name < c.Components[j].Name })
	return c
}
