package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const checkConfig = `
bridge: {id: b1}
stores: {lease: {path: /tmp/x.db}}
sessions:
  - {id: plant, session_mode: exclusive, brokers: ["tcp://127.0.0.1:1883"], client_id: plant,
     connect_timeout: 2s, reconcile_timeout: 2s, unmatched_grace: 1s}
receivers:
  - {id: r, session: plant, topics: [{filter: "a/#"}]}
senders:
  - {id: f, type: file, file: {path: /tmp/f.jsonl}}
routes:
  - {id: rt, receiver: r, senders: [f], lease_ttl: 10s, step_down_grace: 3s, failover_slo: SLO, broker_health_step_down: 20s}
`

func runCheckOn(t *testing.T, slo string) (map[string]any, string, int) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bridge.yaml")
	if err := os.WriteFile(p, []byte(strings.Replace(checkConfig, "SLO", slo, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := commands.Dispatch([]string{"check", "-c", p, "--json"}, &out, &errb)
	var m map[string]any
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out.String())
	}
	return m, errb.String(), code
}

func TestCheckAdmitted(t *testing.T) {
	m, _, code := runCheckOn(t, "120s")
	if code != 0 || m["admitted"] != true {
		t.Fatalf("code %d: %v", code, m)
	}
	s := m["sessions"].([]any)[0].(map[string]any)
	for _, k := range []string{"session_id", "owner_death_budget_s", "broker_path_budget_s", "lease_ttl_s", "activation_s", "broker_path_failover", "admitted"} {
		if _, ok := s[k]; !ok {
			t.Errorf("session report lacks %s", k)
		}
	}
	if s["session_id"] != "plant" || s["owner_death_budget_s"].(float64) != 39.778 {
		t.Fatalf("report: %v", s)
	}
}

func TestCheckRefusedExitsTwo(t *testing.T) {
	m, stderr, code := runCheckOn(t, "30s")
	if code != 2 || m["admitted"] != false {
		t.Fatalf("code %d: %v", code, m)
	}
	if !strings.Contains(stderr, "routes[0].failover_slo: 30s: the owner-death budget is 39.778s") {
		t.Fatalf("stderr: %s", stderr)
	}
}

// TestCheckQueueRoom: a declared peak rate that the broker's default queue
// cannot hold through the worst-case failover is refused, with the
// messages at risk disclosed.
func TestCheckQueueRoom(t *testing.T) {
	m, stderr, code := runCheckOn(t, "120s, peak_message_rate: 250")
	if code != 2 || m["admitted"] != false || !strings.Contains(stderr, "sessions[0].broker_max_queued_messages: (assumed") {
		t.Fatalf("code %d: %v\n%s", code, m, stderr)
	}
	s := m["sessions"].([]any)[0].(map[string]any)
	if s["messages_at_risk"] == nil || s["messages_at_risk"].(float64) <= 1000 || s["admitted"] != false {
		t.Fatalf("session report: %v", s)
	}
}

// A configuration refused for a problem that the session's own assessment
// does not see (two routes of one session that disagree, a sender's
// value) used to print "Verdict: admitted" on standard output and exit 2:
// no session's verdict may say admitted when the exit status says refused.
func TestCheckVerdictAgreesWithTheExitStatus(t *testing.T) {
	second := "  - {id: rt, receiver: r, senders: [f], lease_ttl: 10s, step_down_grace: 3s, failover_slo: SLO, broker_health_step_down: 20s}\n" +
		"  - {id: rt2, receiver: r, senders: [f], lease_ttl: 12s, step_down_grace: 3s, failover_slo: SLO, broker_health_step_down: 20s}\n"
	for _, c := range []struct{ name, body, sessionError string }{
		{"routes that disagree", strings.Replace(checkConfig,
			"  - {id: rt, receiver: r, senders: [f], lease_ttl: 10s, step_down_grace: 3s, failover_slo: SLO, broker_health_step_down: 20s}\n", second, 1),
			`session "plant": routes[0] "rt" and routes[1] "rt2" disagree on lease_ttl (10s vs 12s)`},
		{"a problem elsewhere", strings.Replace(checkConfig, "file: {path: /tmp/f.jsonl}", "file: {path: /tmp/f.jsonl}, retry: {max_attempts: -1}", 1),
			"the configuration is refused (1 problem(s) elsewhere in it), so no session runs"},
	} {
		p := filepath.Join(t.TempDir(), "bridge.yaml")
		if err := os.WriteFile(p, []byte(strings.ReplaceAll(c.body, "SLO", "120s")), 0o600); err != nil {
			t.Fatal(err)
		}
		var out, errb bytes.Buffer
		code := commands.Dispatch([]string{"check", "-c", p}, &out, &errb)
		if code != 2 || strings.Contains(out.String(), "Verdict: admitted") || !strings.Contains(out.String(), "Verdict: NOT admitted") ||
			!strings.Contains(out.String(), "error: ") || !strings.Contains(out.String(), c.sessionError) ||
			!strings.Contains(out.String(), p+": configuration refused: 1 problem(s)") {
			t.Errorf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", c.name, code, out.String(), errb.String())
		}
		out.Reset()
		errb.Reset()
		code = commands.Dispatch([]string{"check", "-c", p, "--json"}, &out, &errb)
		var r checkReport
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		if code != 2 || r.Admitted || len(r.Sessions) != 1 || r.Sessions[0].Admitted || !strings.Contains(strings.Join(r.Sessions[0].Errors, "\n"), c.sessionError) {
			t.Errorf("%s --json: exit %d: %s", c.name, code, out.String())
		}
	}
}
