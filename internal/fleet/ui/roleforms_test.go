package ui_test

import (
	"context"
	"strings"
	"testing"

	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/store"
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
}
