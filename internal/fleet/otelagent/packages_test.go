package otelagent_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"

	"github.com/myriarch/myriarch/internal/fleet/otelagent"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// The OpAMP supervisor v0.149.0 does not accept packages: it declares
// neither AcceptsPackages nor ReportsPackageStatuses (its Capabilities
// config has no such setting: supervisor/config/config.go, and its README
// links both to open issues), so myriarchd refuses to offer it any, with
// the reason. If a later supervisor declares them, this test fails and the
// docs ("Agent software") must be revisited.
func TestRealSupervisorDoesNotAcceptPackages(t *testing.T) {
	otelagent.Binaries(t)
	pg := pgtest.New(t)
	d := replica(t, pg.DSN(""), "replica-p", "127.0.0.1:0")
	defer d.Shutdown()
	tok, err := d.Store.CreateToken(context.Background(), "otel-test")
	if err != nil {
		t.Fatal(err)
	}
	c := api{t: t, base: "http://" + d.HTTPAddr().String(), token: tok}
	sup := otelagent.Start(t, "ws://"+d.OpAMPAddr().String()+"/v1/opamp", otelagent.Options{Secret: secret})
	uid := sup.InstanceUID()
	got := c.until("registered with its capabilities", uid, func(d detail) bool { return len(d.Agent.CapabilityNames) > 0 })
	t.Logf("the supervisor v%s declares %v", otelagent.Version, got.Agent.CapabilityNames)
	for _, capName := range []string{"AcceptsPackages", "ReportsPackageStatuses"} {
		if slices.Contains(got.Agent.CapabilityNames, capName) {
			t.Errorf("the supervisor v%s declares %s now: test package offers with it and update docs/myriarchd.md", otelagent.Version, capName)
		}
	}
	if code := c.call("PUT", "/api/v1/packages/otelcol", `{"type":"oci","source":"127.0.0.1:1/agents/otelcol","poll_interval":"1h"}`, nil); code != http.StatusOK {
		t.Fatalf("put package: %d", code)
	}
	if code := c.call("POST", "/api/v1/packages/otelcol/offers", fmt.Sprintf(`{"version":"v1.0.0","agents":[%q]}`, uid), nil); code != http.StatusConflict {
		t.Fatalf("offer to the supervisor: %d, want 409", code)
	}
}
