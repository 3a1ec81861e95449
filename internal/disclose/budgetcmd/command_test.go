package budgetcmd

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func runBridge(t *testing.T, args ...string) (map[string]any, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := RunBridgeBudget(append(args, "--json"), &out, &errOut)
	var m map[string]any
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		t.Fatalf("stdout is not one JSON object (%v): %q", err, out.String())
	}
	return m, errOut.String(), code
}

func TestBridgeBudgetJSONProfiles(t *testing.T) {
	for _, tc := range []struct {
		args                 []string
		ownerDeath, brokerPt any
	}{
		{[]string{"--broker-health-step-down", "60s"}, 1097.5, 442.5},
		{[]string{"--deployment-mode", "clustered", "--broker-health-step-down", "60s"}, 336.5, 350.0},
		{[]string{"--deployment-mode", "clustered"}, 336.5, nil},
	} {
		m, stderr, code := runBridge(t, tc.args...)
		if code != 0 || stderr != "" {
			t.Fatalf("%v: exit %d, stderr %q", tc.args, code, stderr)
		}
		if m["owner_death_budget_s"] != tc.ownerDeath || m["broker_path_budget_s"] != tc.brokerPt {
			t.Errorf("%v: budgets %v %v", tc.args, m["owner_death_budget_s"], m["broker_path_budget_s"])
		}
		for _, k := range []string{"lease_ttl_s", "renew_interval_s", "lease_renew_jitter_s", "renew_call_timeout_s", "acquire_poll_interval_s",
			"step_down_grace_s", "max_renew_fails", "activation_s", "startup_allowance_s", "owner_death_budget_s", "broker_health_step_down",
			"broker_path_budget_s", "failover_slo_s", "admitted", "errors", "warnings"} {
			if _, ok := m[k]; !ok {
				t.Errorf("%v: key %s missing", tc.args, k)
			}
		}
	}
}

func TestBridgeBudgetRefusals(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    string
		brokerS any
	}{
		{[]string{"--failover-slo", "10m"}, "broker_health_step_down: omitted", "undeclared"},
		{[]string{"--failover-slo", "336.499s", "--deployment-mode", "clustered", "--broker-health-step-down", "off"}, "owner-death budget is 5m36.5s", "off"},
		{[]string{"--lease-ttl", "abc", "--renew-interval", "-1s"}, `--lease-ttl (lease_ttl): "abc": must be a Go duration such as 30s or 1m30s`, "undeclared"},
		{[]string{"--broker-health-step-down", "0s"}, `broker_health_step_down: 0s: must be "off" or a positive duration`, "undeclared"},
		{[]string{"--max-renew-fails", "zero"}, `--max-renew-fails (max_renew_fails): "zero": must be a positive integer`, "undeclared"},
		{[]string{"--connect-timeout", "0s"}, `--connect-timeout (connect_timeout): "0s": must be positive`, "undeclared"},
		{[]string{"--nope"}, "flag provided but not defined: -nope", "undeclared"},
	} {
		m, stderr, code := runBridge(t, tc.args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2", tc.args, code)
		}
		if m["admitted"] != false {
			t.Errorf("%v: admitted %v", tc.args, m["admitted"])
		}
		errs, _ := m["errors"].([]any)
		found := false
		for _, e := range errs {
			found = found || strings.Contains(e.(string), tc.want)
		}
		if !found || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: errors %v / stderr %q, want %q", tc.args, errs, stderr, tc.want)
		}
		if m["broker_health_step_down"] != tc.brokerS {
			t.Errorf("%v: broker_health_step_down %v", tc.args, m["broker_health_step_down"])
		}
	}
	// Both bad values are reported, not only the first.
	m, _, _ := runBridge(t, "--lease-ttl", "abc", "--renew-interval", "-1s")
	if errs := m["errors"].([]any); len(errs) != 2 {
		t.Fatalf("errors %v, want two", errs)
	}
}

func TestBridgeBudgetTable(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := RunBridgeBudget([]string{"--deployment-mode", "clustered", "--broker-health-step-down", "90s", "--failover-slo", "380s"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"Owner-death budget", "336.5s", "13 × renew_call_timeout", "Broker-path budget", "380s", "Verdict: admitted"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestLeaderBudgetJSON(t *testing.T) {
	for _, tc := range []struct {
		t    string
		want map[string]float64
	}{
		{"30s", map[string]float64{"follower_retry_s": 5, "follower_retry_max_s": 6, "acquisition_margin_s": 1.5, "detection_s": 22,
			"tcp_keepalives_idle": 3, "tcp_keepalives_interval": 3, "tcp_keepalives_count": 6, "tcp_user_timeout_ms": 19000,
			"earliest_drop_s": 19, "latest_drop_s": 22, "confirm_interval_s": 5, "confirm_timeout_s": 10, "resign_after_s": 15, "termination_grace_period_s": 90}},
		{"10s", map[string]float64{"detection_s": 7, "tcp_keepalives_idle": 1, "tcp_keepalives_count": 6, "tcp_user_timeout_ms": 6000, "resign_after_s": 5}},
		{"10m", map[string]float64{"detection_s": 564, "tcp_keepalives_idle": 94, "tcp_keepalives_count": 5, "tcp_user_timeout_ms": 470000, "acquisition_margin_s": 30}},
	} {
		var out, errOut bytes.Buffer
		if code := RunLeaderBudget([]string{"--leader-session-timeout", tc.t, "--json"}, DefaultLeaderInputs(), &out, &errOut); code != 0 {
			t.Fatalf("%s: exit %d %s", tc.t, code, errOut.String())
		}
		var m map[string]any
		if err := json.Unmarshal(out.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		if errs, ok := m["errors"].([]any); !ok || len(errs) != 0 {
			t.Errorf("T=%s: errors = %v, want an empty list", tc.t, m["errors"])
		}
		for k, v := range tc.want {
			if m[k] != v {
				t.Errorf("T=%s: %s = %v, want %v", tc.t, k, m[k], v)
			}
		}
	}
	var out, errOut bytes.Buffer
	if code := RunLeaderBudget([]string{"--leader-session-timeout", "9s", "--json"}, DefaultLeaderInputs(), &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "[10s, 10m0s]") || !strings.Contains(out.String(), "[10s, 10m0s]") {
		t.Fatalf("T=9s: exit %d, stdout %q stderr %q", code, out.String(), errOut.String())
	}
}

// TestBridgeBudgetQueueRoom: budget discloses rate × worst-case budget and
// refuses a broker queue that cannot hold it.
func TestBridgeBudgetQueueRoom(t *testing.T) {
	base := []string{"--deployment-mode", "clustered", "--broker-health-step-down", "60s", "--peak-message-rate", "200"}
	m, stderr, code := runBridge(t, base...)
	if code != 2 || m["admitted"] != false || m["messages_at_risk"] != 70000.0 || m["broker_max_queued_messages"] != 1000.0 || m["broker_queue_limit_assumed"] != true ||
		!strings.Contains(stderr, "broker_max_queued_messages: 1000: (assumed") || !strings.Contains(stderr, "= 70000 messages") {
		t.Errorf("assumed default queue: exit %d, %v\n%s", code, m, stderr)
	}
	m, stderr, code = runBridge(t, append(base, "--broker-max-queued-messages", "70000")...)
	if code != 0 || m["admitted"] != true || m["messages_at_risk"] != 70000.0 || !strings.Contains(m["queue_room"].(string), "fits") {
		t.Errorf("room for 70000: exit %d, %v\n%s", code, m, stderr)
	}
	m, _, code = runBridge(t, "--deployment-mode", "clustered")
	if code != 0 || m["messages_at_risk"] != nil || !strings.Contains(m["queue_room"].(string), "not declared") {
		t.Errorf("no rate: exit %d, %v", code, m)
	}
	_, stderr, code = runBridge(t, "--peak-message-rate", "-1", "--broker-max-queued-messages", "lots")
	if code != 2 || !strings.Contains(stderr, `--peak-message-rate (peak_message_rate): "-1"`) || !strings.Contains(stderr, `--broker-max-queued-messages (broker_max_queued_messages): "lots"`) {
		t.Errorf("bad values: exit %d\n%s", code, stderr)
	}
}

// The starting values are values (the loaded configuration), and a flag
// given explicitly overrides them.
func TestLeaderBudgetStartsFromInputs(t *testing.T) {
	in := LeaderInputs{LeaderSessionTimeout: 20 * time.Second, ShutdownTimeout: 45 * time.Second, PreStopSleep: 0}
	for _, tc := range []struct {
		args      []string
		t, grace  float64
		code      int
		errSubstr string
	}{
		{nil, 20, 110, 0, ""},
		{[]string{"--leader-session-timeout", "40s"}, 40, 110, 0, ""},
		{[]string{"--shutdown-timeout", "1m"}, 20, 140, 0, ""},
		{[]string{"--shutdown-timeout", "soon"}, 0, 0, 2, `--shutdown-timeout (server.shutdownTimeout): "soon": must be a Go duration such as 30s or 1m30s`},
	} {
		var out, errOut bytes.Buffer
		code := RunLeaderBudget(append(tc.args, "--json"), in, &out, &errOut)
		var m map[string]any
		if err := json.Unmarshal(out.Bytes(), &m); err != nil {
			t.Fatalf("%v: not JSON: %q", tc.args, out.String())
		}
		if code != tc.code || (tc.errSubstr != "" && !strings.Contains(errOut.String(), tc.errSubstr)) {
			t.Fatalf("%v: exit %d, stderr %q", tc.args, code, errOut.String())
		}
		if tc.code == 0 && (m["leader_session_timeout_s"] != tc.t || m["termination_grace_period_s"] != tc.grace) {
			t.Errorf("%v: T %v grace %v, want %v %v", tc.args, m["leader_session_timeout_s"], m["termination_grace_period_s"], tc.t, tc.grace)
		}
	}
}
