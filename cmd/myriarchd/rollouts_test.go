package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// `myriarchd config ...` and `myriarchd rollout ...` through the API of a
// replica that leads and carries the rollout out.
func TestConfigAndRolloutCommands(t *testing.T) {
	pg := pgtest.New(t)
	d := inProcessReplica(t, pg.DSN(""), "replica-c", map[string]string{"jobs.rolloutInterval": "100ms", "ha.leaderSessionTimeout": "10s"})
	tok, err := d.Store.CreateToken(t.Context(), "cli")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MYRIARCH_SERVER", "http://"+d.HTTPAddr().String())
	t.Setenv("MYRIARCH_TOKEN", tok)
	run := func(args ...string) (string, string, int) {
		var out, errb syncBuf
		code := commands.Dispatch(args, &out, &errb)
		return out.String(), errb.String(), code
	}
	must := func(args ...string) string {
		t.Helper()
		out, errOut, code := run(args...)
		if code != 0 {
			t.Fatalf("%q: exit %d: %s%s", args, code, out, errOut)
		}
		return out
	}
	refused := func(want string, args ...string) {
		t.Helper()
		out, errOut, code := run(args...)
		if code != 2 || !strings.Contains(errOut, want) {
			t.Errorf("%q: exit %d, %q %q; want exit 2 with %q", args, code, out, errOut, want)
		}
	}
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	refused(`type "json": must be one of myriarch-bridge, yaml (HTTP 400)`, "config", "put", "web", "--type", "json")
	must("config", "put", "web", "--type", "yaml", "--selector", "role=web", "--priority", "5")
	bad := write("bad.yaml", "a: 1\nb: [\n")
	refused("not well-formed YAML", "config", "revise", "web", "--file", bad)
	// The server's problem names the line; the CLI names the file it read.
	refused("  "+bad+":2: not well-formed YAML", "config", "revise", "web", "--file", bad)
	must("config", "put", "plant", "--type", "myriarch-bridge")
	badBridge := write("bridge.yaml", bridgeGood+"unknown_section: 1\n")
	refused("  "+badBridge+":33: unknown_section: unknown key", "config", "revise", "plant", "--file", badBridge)
	if out := must("config", "revise", "web", "--file", write("v1.yaml", "port: 80\n")); !strings.Contains(out, "stored revision 1 of web") {
		t.Errorf("revise: %q", out)
	}
	if out := must("config", "revise", "web", "--file", write("v1b.yaml", "port: 80\n")); !strings.Contains(out, "unchanged: equal to revision 1") {
		t.Errorf("revise unchanged: %q", out)
	}
	must("config", "revise", "web", "--file", write("v2.yaml", "port: 8080\n"))
	if out := must("config", "diff", "web", "1", "2"); !strings.Contains(out, "-port: 80\n+port: 8080\n") {
		t.Errorf("diff: %q", out)
	}
	if out := must("config", "cat", "web", "2"); out != "port: 8080\n" {
		t.Errorf("cat: %q", out)
	}
	if out := must("config", "list"); !strings.Contains(out, "web") || !strings.Contains(out, "role=web") {
		t.Errorf("list: %q", out)
	}
	refused(`waves ["10%"]: the last wave must be "100%"`, "rollout", "create", "web", "--waves", "10%")
	refused(`failure_policy rollback: web has no current revision`, "rollout", "create", "web", "--failure-policy", "rollback")
	if out := must("rollout", "create", "web", "--to", "1", "--bake", "0s"); !strings.Contains(out, "rollout 1 created: web revision 0 → 1") {
		t.Errorf("create: %q", out)
	}
	if out, errOut, code := run("rollout", "create", "web"); code != 1 || !strings.Contains(errOut, "rollout 1 of web is still active") {
		t.Errorf("overlapping create: %d %q %q", code, out, errOut)
	}

	ag, err := fleettest.StartAgent(t.Context(), fleettest.AgentOptions{URL: "ws://" + d.OpAMPAddr().String() + "/v1/opamp", Secret: testSecret,
		Attrs: map[string]string{"role": "web"}})
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Stop(t.Context())
	// The agent registers after the rollout was created; the planner
	// selects agents when it plans, so it may find none. Either way the
	// rollout finishes.
	if !fleettest.Eventually(time.Minute, func() bool {
		out := must("rollout", "show", "1")
		return strings.Contains(out, rollout.StateSucceeded)
	}) {
		t.Fatalf("rollout 1 did not succeed: %s", must("rollout", "show", "1"))
	}
	if !fleettest.Eventually(time.Minute, func() bool {
		a, err := d.Store.GetAgent(t.Context(), ag.UIDString())
		return err == nil && a.Identifying["role"] == "web"
	}) {
		t.Fatal("agent not registered")
	}
	must("rollout", "create", "web", "--bake", "0s", "--waves", "100%")
	if !fleettest.Eventually(time.Minute, func() bool {
		return strings.Contains(must("rollout", "show", "2"), "succeeded")
	}) {
		t.Fatalf("rollout 2: %s", must("rollout", "show", "2"))
	}
	if got := ag.Configs(); len(got) == 0 || got[len(got)-1] != "port: 8080\n" {
		t.Errorf("agent received %q", got)
	}
	if out := must("rollout", "list"); !strings.Contains(out, "0 → 1") || !strings.Contains(out, "1 → 2") {
		t.Errorf("list: %q", out)
	}
	if out, errOut, code := run("rollout", "pause", "2"); code != 1 || !strings.Contains(errOut, "rollout 2 is succeeded") {
		t.Errorf("pause of a finished rollout: %d %q %q", code, out, errOut)
	}

	// Previews: the diff of the first revision starts from the empty
	// document (the UI's diff form pre-fills 0 → 1), a revision is
	// previewed against what the agent runs now, and a plan is a dry run.
	if out := must("config", "diff", "web", "0", "1"); !strings.Contains(out, "+port: 80\n") {
		t.Errorf("diff 0 1: %q", out)
	}
	refused(`revision "x": must be 0 (the empty document) or a positive integer`, "config", "diff", "web", "x", "1")
	must("config", "revise", "web", "--file", write("v3.yaml", "port: 9090\n"))
	if out := must("config", "preview", "web", "3"); !strings.Contains(out, "1 agent(s) running") || !strings.Contains(out, "would change") ||
		!strings.Contains(out, ag.UIDString()) || !strings.Contains(out, "-port: 8080\n+port: 9090\n") {
		t.Errorf("preview: %q", out)
	}
	if out := must("config", "preview", "web", "2"); !strings.Contains(out, "up to date") {
		t.Errorf("preview of the running revision: %q", out)
	}
	out := must("rollout", "plan", "web", "--waves", "100%", "--order", "standbys-first")
	if !strings.Contains(out, "plan: web revision 3, order standbys-first, 1 wave(s)") || !strings.Contains(out, ag.UIDString()) {
		t.Errorf("plan: %q", out)
	}
	if out := must("rollout", "list"); strings.Contains(out, "2 → 3") {
		t.Errorf("a plan stored a rollout: %q", out)
	}
	refused(`order "sideways"`, "rollout", "plan", "web", "--order", "sideways")
	if out := must("agent", "list", "--role", "standby"); strings.Contains(out, ag.UIDString()) {
		t.Errorf("agent list --role standby lists an agent without sessions: %q", out)
	}
	refused(`role`, "agent", "list", "--role", "boss")
}
