package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// asMainEnv makes the test binary act as myriarch-loadagents: the scale
// command re-executes itself (os.Executable) as its load processes and
// the bare server.
const asMainEnv = "MYRIARCH_LOADAGENTS_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		os.Exit(commands.Dispatch(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// The scale command end to end at a tiny size: two real replicas behind
// HAProxy, a load process with WebSocket and plain-HTTP agents, a bare
// opamp-go server, a rollout, a follower and then the leader killed, a
// revocation storm. The JSON must be consistent: every agent online, none
// lost or counted twice after the kill, each agent got the revision sent
// while the leader died exactly once.
//
// Its rollout check ("every agent got the revision once") failed until a
// plain-HTTP agent behind the balancer stopped getting a config again
// from the replica that had not seen its report (opampserver forPoll):
// 8 to 29 of the 40 plain-HTTP agents got the revision twice.
func TestScaleCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("an end-to-end scale run (about a minute)")
	}
	if _, err := haproxyBinary(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI needs haproxy for the scale test: %v", err)
		}
		t.Skip(err)
	}
	bin := buildMyriarchd(t)
	t.Setenv(asMainEnv, "1")
	const n = 200
	var out, errb syncBuf
	code := commands.Dispatch([]string{"scale", "--agents", "200", "--replicas", "2", "--per-process", "120", "--http-every", "5",
		"--poll", "2s", "--settle", "1s", "--steady", "2s", "--rate", "400", "--bake", "0s", "--interval", "300ms", "--revoke", "20",
		"--json", "--myriarchd", bin, "--dir", t.TempDir()}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d:\n%s\n%s", code, out.String(), errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("want one JSON line, got %d:\n%s", len(lines), out.String())
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"agents", "online", "replicas", "kb_per_agent", "bare_kb_per_agent", "replica_cpu_pct", "pg_cpu_pct",
		"connect_all_s", "rollout_plan_s", "wave_apply_s", "replica_kill_all_online_s", "lost", "double_counted"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("field %q missing: %s", k, lines[0])
		}
	}
	var r scaleResult
	if err := json.Unmarshal([]byte(lines[0]), &r); err != nil {
		t.Fatal(err)
	}
	check := func(ok bool, what string) {
		t.Helper()
		if !ok {
			t.Errorf("%s: %s\nprogress:\n%s", what, lines[0], errb.String())
		}
	}
	check(r.Agents == n && r.Online == n && r.Replicas == 2, "agents, online, replicas")
	check(r.LoadProcesses == 2 && r.HTTPAgents == 40, "two load processes, every 5th agent plain HTTP")
	check(r.KBPerAgent > 0 && r.BareKBPerAgent > 0 && r.BareAgents == n/2, "memory per agent measured for both servers")
	check(r.ConnectAllS > 0 && r.PGConnections > 0 && r.WritesPerS >= 0, "connect time and PostgreSQL figures")
	check(r.RolloutPlanS > 0 && r.WaveApplyS > 0 && r.WaveAgents == n/2 && r.RolloutRevOnce == n, "rollout: plan, last wave, every agent once")
	check(r.KilledReplicaAgents > 0 && r.ReplicaKillAllOnlineS > 0, "a follower with agents killed, all online again")
	check(r.Lost == 0 && r.DoubleCounted == 0 && r.APIOnline == n, "none lost, none double-counted, the API lists all")
	check(r.LeaderFailoverS > 0 && r.LeaderKillRolloutS >= r.LeaderFailoverS, "leader killed: a new leader, the rollout finished")
	check(r.RevisionOnce == n && r.RevisionDuplicates == 0 && r.RevisionMissing == 0, "revision 2 at every agent exactly once")
	// The rest is not asserted online: revoked agents retrying with the
	// secret make myriarchd refuse the secret from their source (here
	// every agent's) for a while (docs/myriarchd.md, Scale).
	check(r.Revoked == 20 && r.RevokeAllOfflineS > 0 && r.RevokeHTTPOfflineS >= r.RevokeAllOfflineS && r.FinalOnline <= n-20,
		"revocation storm: 20 revoked, all offline")
	check(len(r.Errors) == 0, "no errors")

	// The report renders the same line as a table and a plot.
	var tbl, rerr syncBuf
	if err := runScaleReport(nil, strings.NewReader(lines[0]+"\n"), &tbl, &rerr); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tbl.String(), "| 200 agents, 2 replicas |") {
		t.Errorf("table:\n%s", tbl.String())
	}
	if svg := scaleSVG([]scaleResult{r}); !strings.HasPrefix(svg, "<svg") || !strings.Contains(svg, "<polyline") {
		t.Errorf("svg: %s", svg)
	}
}

// Bad flags name the flag, the value and the rule.
func TestScaleFlags(t *testing.T) {
	for _, c := range []struct{ args, want string }{
		{"--agents 10,x", `--agents "10,x": want positive whole numbers`},
		{"--replicas 0", "--replicas 0: must be within [1, 32]"},
		{"--per-process 10000", "--per-process 10000: must be within [1, 9000]"},
		{"--replicas 1", "--replicas 1: the operations (replica and leader kill) need at least 2"},
	} {
		var out, errb syncBuf
		if code := commands.Dispatch(append([]string{"scale"}, strings.Fields(c.args)...), &out, &errb); code != 2 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%s: exit %d, %q", c.args, code, errb.String())
		}
	}
}

// The HAProxy configuration is valid for haproxy -c and has the settings
// the docs name.
func TestHAProxyConfig(t *testing.T) {
	text := haproxyText("127.0.0.1:4400", 9000, []*replicaProc{{id: "r1", httpAddr: "127.0.0.1:8081", opampAddr: "127.0.0.1:4321"}})
	for _, want := range []string{"balance leastconn", "timeout tunnel 1h", "http-check send meth GET uri /readyz", "option redispatch",
		"server r1 127.0.0.1:4321 check port 8081", "maxconn 9000"} {
		if !strings.Contains(text, want) {
			t.Errorf("config lacks %q:\n%s", want, text)
		}
	}
	bin, err := haproxyBinary()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI needs haproxy: %v", err)
		}
		t.Skip(err)
	}
	cfg := filepath.Join(t.TempDir(), "h.cfg")
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-c", "-f", cfg).CombinedOutput(); err != nil {
		t.Errorf("haproxy -c: %v\n%s", err, out)
	}
}
