package ui_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/open-telemetry/opamp-go/protobufs"

	"github.com/myriarch/myriarch/internal/fleet/fleettest"
)

// The agent page shows the health error text, the component health and
// the capabilities by name, and its restart and clear-config buttons
// reach the agent; the REST API answers the same.
func TestAgentPageHealthCapabilitiesAndActions(t *testing.T) {
	browser := chromium(t)
	const secret = "0123456789abcdef-secret" // startUI's enrollment secret
	d := startUI(t, "replica-ui", map[string]string{"ha.heartbeatInterval": "1s", "server.lastSeenFlushInterval": "200ms"})
	ctx := context.Background()
	tok, err := d.Store.CreateToken(ctx, "ui")
	if err != nil {
		t.Fatal(err)
	}
	var restarts atomic.Int64
	ag, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + d.OpAMPAddr().String() + "/v1/opamp", Secret: secret,
		OnCommand: func(c *protobufs.ServerToAgentCommand) { restarts.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Stop(ctx)
	plain, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + d.OpAMPAddr().String() + "/v1/opamp", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Stop(ctx)
	// A bridge reports one health component per session (see
	// internal/bridge/opamp).
	bridge, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + d.OpAMPAddr().String() + "/v1/opamp", Secret: secret,
		Attrs: map[string]string{"service.name": "myriarch-bridge"}})
	if err != nil {
		t.Fatal(err)
	}
	defer bridge.Stop(ctx)
	if err := bridge.Client.SetHealth(&protobufs.ComponentHealth{Healthy: true, Status: "ready",
		ComponentHealthMap: map[string]*protobufs.ComponentHealth{"session/plant": {Healthy: true,
			Status: "mode=exclusive role=owner service_level=full lease_version=7 lease_owner=a#1f in_flight=0 last_takeover_to_full_s=0.012 owner_death_budget_s=27.389"}}}); err != nil {
		t.Fatal(err)
	}
	const boom = "pipeline traces: exporter otlp: connection refused"
	if err := ag.Client.SetHealth(&protobufs.ComponentHealth{Healthy: false, LastError: boom, Status: "StatusRecoverableError",
		ComponentHealthMap: map[string]*protobufs.ComponentHealth{"pipeline:traces": {Healthy: false, Status: "StatusRecoverableError",
			ComponentHealthMap: map[string]*protobufs.ComponentHealth{"exporter:otlp": {Healthy: false, LastError: "connection refused"}}}}}); err != nil {
		t.Fatal(err)
	}
	if !fleettest.Eventually(30*time.Second, func() bool {
		a, err := d.Store.GetAgent(ctx, ag.UIDString())
		p, err2 := d.Store.GetAgent(ctx, plain.UIDString())
		b, err3 := d.Store.GetAgent(ctx, bridge.UIDString())
		return err == nil && err2 == nil && err3 == nil && strings.Contains(string(a.Health), boom) && p.Capabilities != 0 &&
			strings.Contains(string(b.Health), "lease_version=7")
	}) {
		t.Fatal("agents not registered")
	}
	if _, err := d.Store.SetDesiredConfig(ctx, ag.UIDString(), "receivers: {otlp: {}}\n"); err != nil {
		t.Fatal(err)
	}

	// The REST API: capabilities by name; restart refused for an agent
	// that does not accept it.
	base := "http://" + d.HTTPAddr().String()
	call := func(method, path string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	_, detail := call("GET", "/api/v1/agents/"+ag.UIDString())
	caps, _ := json.Marshal(detail["agent"].(map[string]any)["capability_names"])
	if !strings.Contains(string(caps), `"AcceptsRestartCommand"`) || !strings.Contains(string(caps), `"ReportsHealth"`) {
		t.Errorf("capability_names: %s", caps)
	}
	if code, out := call("POST", "/api/v1/agents/"+plain.UIDString()+"/restart"); code != http.StatusConflict ||
		!strings.Contains(out["error"].(string), "does not accept the restart command") {
		t.Errorf("restart of an agent without the capability: %d %v", code, out)
	}
	if code, _ := call("POST", "/api/v1/agents/00000000-0000-4000-8000-000000000000/restart"); code != http.StatusNotFound {
		t.Errorf("restart of an unknown agent: %d", code)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-background-networking", true))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	bctx, tcancel := context.WithTimeout(bctx, 2*time.Minute)
	defer tcancel()
	q := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	do := func(steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			t.Fatal(err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Text(q(sel)))
		if err != nil {
			t.Fatalf("%s: %v", sel, err)
		}
		return v
	}
	check := func(what, got, want string) {
		t.Helper()
		if !strings.Contains(got, want) {
			t.Errorf("%s: %q does not contain %q", what, got, want)
		}
	}
	do(chromedp.Navigate(base+"/ui/login"), chromedp.WaitVisible(q("#login-form")),
		chromedp.SendKeys(q("#token"), tok), chromedp.Click(q("#login-submit")), chromedp.WaitVisible(q("#count-total")))
	do(chromedp.Navigate(base+"/ui/agents"), chromedp.WaitVisible(q("#agents tr.agent")))
	check("agent list health", text("#agents"), boom)
	do(chromedp.Navigate(base+"/ui/agents?kind=bridge"), chromedp.WaitVisible(q("#agents tr.agent")))
	if list := text("#agents"); !strings.Contains(list, bridge.UIDString()) || strings.Contains(list, ag.UIDString()) {
		t.Errorf("kind=bridge lists %q", list)
	}
	do(chromedp.Navigate(base+"/ui/agents/"+bridge.UIDString()), chromedp.WaitVisible(q("#bridge-sessions")))
	sessions := text("#bridge-sessions")
	for _, want := range []string{"plant", "exclusive", "owner", "full", "7", "a#1f", "0.012 s", "27.389 s"} {
		check("bridge sessions", sessions, want)
	}
	do(chromedp.Navigate(base+"/ui/agents/"+ag.UIDString()), chromedp.WaitVisible(q("#agent-health-error")))
	check("health error", text("#agent-health-error"), boom)
	comps := text("#components")
	check("components", comps, "pipeline:traces")
	check("components", comps, "exporter:otlp")
	check("components", comps, "connection refused")
	check("capabilities", text("#capabilities"), "AcceptsRestartCommand")
	check("capabilities", text("#capabilities"), "ReportsEffectiveConfig")

	do(chromedp.Click(q("#restart-agent")), chromedp.WaitVisible(q("#action-notice")))
	check("restart notice", text("#action-notice"), "Restart requested")
	if !fleettest.Eventually(30*time.Second, func() bool { return restarts.Load() == 1 }) {
		t.Fatalf("restart from the UI: %d commands reached the agent", restarts.Load())
	}
	// From a page without a notice, so that the wait sees the new one.
	do(chromedp.Navigate(base+"/ui/agents/"+ag.UIDString()), chromedp.WaitVisible(q("#clear-config")),
		chromedp.Click(q("#clear-config")), chromedp.WaitVisible(q("#action-notice")))
	check("clear notice", text("#action-notice"), "Desired config cleared")
	check("desired config", text("#desired-config"), "cleared")
	if !fleettest.Eventually(30*time.Second, func() bool {
		c := ag.Configs()
		return len(c) == 2 && c[0] != "" && c[1] == ""
	}) {
		t.Fatalf("configs the agent got: %q", ag.Configs())
	}
	do(chromedp.Navigate(base+"/ui/agents/"+plain.UIDString()), chromedp.WaitVisible(q("#restart-agent")),
		chromedp.Click(q("#restart-agent")), chromedp.WaitVisible(q("#action-error")))
	check("refused restart", text("#action-error"), "does not accept the restart command")
	bcancel()
	acancel()
}
