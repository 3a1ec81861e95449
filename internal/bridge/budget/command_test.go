package budget

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
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
