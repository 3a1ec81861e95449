package ui_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/fleet/ui"
)

// A configuration page shows the rollout form only to sessions whose role
// may start one (the route refuses it anyway; the page should not offer
// what the viewer cannot do).
func TestConfigPageOffersRolloutsByRole(t *testing.T) {
	d := startUI(t, "replica-roles", nil)
	if _, err := (configs.Service{Store: d.Store}).Put(context.Background(), store.ConfigDef{Name: "edge", Type: configs.TypeYAML, Selector: map[string]string{"role": "edge"}}); err != nil {
		t.Fatal(err)
	}
	if p := getPage(t, d, sessionOf(t, d, store.RoleViewer), "/ui/configs/edge"); strings.Contains(p, `id="rollout-form"`) {
		t.Error("a viewer is offered the rollout form")
	}
	if p := getPage(t, d, sessionOf(t, d, store.RoleOperator), "/ui/configs/edge"); !strings.Contains(p, `id="rollout-form"`) {
		t.Error("an operator is not offered the rollout form")
	}
	// A parameter PostgreSQL cannot store is a 400 naming it, not a 500
	// (or a page) showing a SQLSTATE.
	viewer := sessionOf(t, d, store.RoleViewer)
	for _, path := range []string{"/ui/agents?bridge_id=%00", "/ui/agents/a%00b", "/ui/configs/edge?preview=1&selector=a%3D%00"} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+d.HTTPAddr().String()+path, nil)
		req.AddCookie(&http.Cookie{Name: ui.CookieName, Value: viewer})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "must not contain NUL") || strings.Contains(string(b), "SQLSTATE") {
			t.Errorf("GET %s: %d %s", path, resp.StatusCode, b)
		}
	}
}
