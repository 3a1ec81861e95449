package budget

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

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
