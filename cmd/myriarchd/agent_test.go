package main

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"

	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// `myriarchd agent show|restart|clear-config|allow-reenroll` through the REST API of a
// running replica, with a real OpAMP agent.
func TestAgentCommands(t *testing.T) {
	pg := pgtest.New(t)
	d := inProcessReplica(t, pg.DSN(""), "replica-c", nil)
	ctx := context.Background()
	tok, err := d.Store.CreateToken(ctx, "cli")
	if err != nil {
		t.Fatal(err)
	}
	var restarts atomic.Int64
	ag, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + d.OpAMPAddr().String() + "/v1/opamp", Secret: testSecret,
		OnCommand: func(*protobufs.ServerToAgentCommand) { restarts.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Stop(ctx)
	uid := ag.UIDString()
	if err := ag.Client.SetHealth(&protobufs.ComponentHealth{Healthy: false, LastError: "exporter failed",
		ComponentHealthMap: map[string]*protobufs.ComponentHealth{"pipeline:traces": {Healthy: false, Status: "StatusPermanentError"}}}); err != nil {
		t.Fatal(err)
	}
	if !fleettest.Eventually(30*time.Second, func() bool {
		a, err := d.Store.GetAgent(ctx, uid)
		return err == nil && strings.Contains(string(a.Health), "exporter failed")
	}) {
		t.Fatal("agent not registered")
	}
	t.Setenv("MYRIARCH_TOKEN", tok)
	t.Setenv("MYRIARCH_SERVER", "http://"+d.HTTPAddr().String())
	run := func(args ...string) (string, string, int) {
		var out, errb syncBuf
		code := commands.Dispatch(append([]string{"agent"}, args...), &out, &errb)
		return out.String(), errb.String(), code
	}
	out, errOut, code := run("show", uid)
	for _, want := range []string{"status         online (replica replica-c)", "health         unhealthy", "error: exporter failed",
		"pipeline:traces: unhealthy (StatusPermanentError)", "AcceptsRestartCommand"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("show: %d, %q lacks %q (stderr %q)", code, out, want, errOut)
		}
	}
	if out, errOut, code = run("restart", uid); code != 0 {
		t.Fatalf("restart: %d %q %q", code, out, errOut)
	}
	if !fleettest.Eventually(30*time.Second, func() bool { return restarts.Load() == 1 }) {
		t.Fatal("the restart never reached the agent")
	}
	if _, err := d.Store.SetDesiredConfig(ctx, uid, "a: 1\n"); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code = run("clear-config", "-o", "json", uid); code != 0 || !strings.Contains(out, "cleared") {
		t.Fatalf("clear-config: %d %q %q", code, out, errOut)
	}
	if !fleettest.Eventually(30*time.Second, func() bool { c := ag.Configs(); return len(c) > 0 && c[len(c)-1] == "" }) {
		t.Fatalf("configs: %q", ag.Configs())
	}
	// Bad input: named, and nothing is called.
	if _, errOut, code = run("show"); code != 2 || !strings.Contains(errOut, "takes UID, got []") {
		t.Fatalf("no uid: %d %q", code, errOut)
	}
	if _, errOut, code = run("show", uid, "--server", "localhost:8080"); code != 2 || !strings.Contains(errOut, `server "localhost:8080": must be an http:// or https:// URL`) {
		t.Fatalf("bad server: %d %q", code, errOut)
	}
	if _, errOut, code = run("restart", "00000000-0000-4000-8000-000000000000"); code != 1 || !strings.Contains(errOut, "no agent") || !strings.Contains(errOut, "HTTP 404") {
		t.Fatalf("unknown agent: %d %q", code, errOut)
	}
	// allow-reenroll: an agent without a credential needs none; one that
	// holds a credential may enroll once more with the secret.
	if _, errOut, code = run("allow-reenroll", uid); code != 1 || !strings.Contains(errOut, "has no credential") || !strings.Contains(errOut, "HTTP 404") {
		t.Fatalf("allow-reenroll without a credential: %d %q", code, errOut)
	}
	if _, err := d.Store.IssueAgentCredential(ctx, uid); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code = run("allow-reenroll", uid, "-o", "json"); code != 0 || !strings.Contains(out, `"reenroll_allowed_by": "token cli`) {
		t.Fatalf("allow-reenroll: %d %q %q", code, out, errOut)
	}
	if c, _, err := d.Store.AgentCredentialOf(ctx, uid); err != nil || c.ReenrollAllowedAt == nil {
		t.Fatalf("allowance not stored: %+v %v", c, err)
	}
	if evs, err := d.Store.Events(ctx, uid, 100); err != nil || !slices.ContainsFunc(evs, func(e store.Event) bool { return e.Kind == store.EventReenrollAllowed }) {
		t.Fatalf("no reenroll_allowed event: %v", err)
	}
	t.Setenv("MYRIARCH_TOKEN", "")
	if _, errOut, code = run("show", uid); code != 2 || !strings.Contains(errOut, "token: required") {
		t.Fatalf("no token: %d %q", code, errOut)
	}
}
