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

func (h *handler) allowReenroll(w http.ResponseWriter, r *http.Request) {
	_, err := h.a.AllowReenroll(r.Context(), r.PathValue("uid"))
	h.agentDone(w, r, err, "agent "+r.PathValue("uid")+" has no credential", "agent re-enrollment allowed from the UI", "reenroll")
}

func (h *handler) revokeAgent(w http.ResponseWriter, r *http.Request) {
	_, err := h.a.RevokeAgent(r.Context(), r.PathValue("uid"))
	h.agentDone(w, r, err, "no agent "+r.PathValue("uid"), "agent revoked from the UI", "revoked")
}

func (h *handler) restartAgent(w http.ResponseWriter, r *http.Request) {
	err := h.a.RestartAgent(r.Context(), r.PathValue("uid"))
	h.agentDone(w, r, err, "no agent "+r.PathValue("uid"), "agent restart requested from the UI", "restart")
}

func (h *handler) clearConfig(w http.ResponseWriter, r *http.Request) {
	_, err := h.a.ClearConfig(r.Context(), r.PathValue("uid"))
	h.agentDone(w, r, err, "no agent "+r.PathValue("uid"), "remote config cleared from the UI", "cleared")
}

// agentDone answers an agent action the same way for every form: 404
// (notFound) for an unknown agent, the agent page again with 409 for an
// agent that cannot take a restart now, the error page for any other
// error, and otherwise a log line naming the token and a redirect to the
// agent's page with the notice done.
func (h *handler) agentDone(w http.ResponseWriter, r *http.Request, err error, notFound, logMsg, done string) {
	switch {
	case errors.Is(err, store.ErrNotFound):
		http.Error(w, notFound, http.StatusNotFound)
	case errors.Is(err, api.ErrCannotRestart):
		w.WriteHeader(http.StatusConflict)
		h.agentPage(w, r, err.Error())
	case err != nil:
		h.fail(w, err)
	default:
		h.log.Info(logMsg, "agent", r.PathValue("uid"), "token", api.TokenName(r.Context()))
		backToAgent(w, r, done)
	}
}

// notices are the outcomes an action redirects to (?done=...); a code,
// not free text, so that a link cannot put words on the page.
var notices = map[string]string{
	"restart":  "Restart requested; the replica the agent is connected to sends it.",
	"cleared":  "Desired config cleared; the agent is sent an empty config.",
	"revoked":  "Agent revoked: it is disconnected and can neither connect nor enroll again.",
	"reenroll": "Re-enrollment allowed: the agent's next enrollment with the secret gets a new credential (once).",
}

// backToAgent redirects to the agent's page with a notice.
func backToAgent(w http.ResponseWriter, r *http.Request, done string) {
	http.Redirect(w, r, "/ui/agents/"+url.PathEscape(r.PathValue("uid"))+"?done="+done, http.StatusSeeOther)
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
