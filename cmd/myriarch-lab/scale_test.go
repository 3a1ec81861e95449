package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/lab"
)

// TestScaleLab runs the scale lab at a small scale with the real bridge
// binary against mosquitto: 20 exclusive sessions per process on sqlite,
// after the one-session reference, the owner killed and then stopped
// cleanly. Every session must move to the successor with a higher lease
// version and reach full service within its budget, nothing may be lost
// or delivered by a stale owner, and the measurements the JSON promises
// must be there.
func TestScaleLab(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two bridge processes with 1 and 20 sessions through two failovers (~1 minute)")
	}
	_, err := lab.MosquittoPath()
	need(t, "mosquitto", err)
	bin, err := bridgeBinary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	m, err := lab.StartMosquitto(context.Background(), dir, 100000)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cmd, err := bridgeCommand(bin)
	if err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	const n = 20
	rep, err := lab.RunScale(context.Background(), lab.ScaleOptions{Command: cmd, Sessions: n, Store: lab.StoreSQLite, Broker: m.URL,
		IdleWindow: 2 * time.Second, Progress: &progress})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	t.Logf("\n%s", progress.String())
	if len(rep.Single) != 2 || len(rep.Scenarios) != 2 {
		t.Fatalf("%d reference and %d scenario results, want 2 and 2", len(rep.Single), len(rep.Scenarios))
	}
	for _, r := range append(rep.Single, rep.Scenarios...) {
		want := n
		if r.Sessions == 1 {
			want = 1
		} else if r.Sessions != n {
			t.Errorf("%s: %d sessions, want %d", r.Scenario, r.Sessions, n)
		}
		if !r.Pass || r.SessionsWithinBudget != want || r.LeasesMoved != want || r.Lost != 0 || r.StaleDeliveries != 0 || r.Unstamped != 0 ||
			r.Published == 0 || r.Duplicates > r.DuplicateBound || r.AllFullS <= 0 || r.MaxFailureToFullS <= 0 || r.MaxFailureToFullS > r.BudgetS ||
			r.SingleSessionFullS <= 0 || r.BrokerConnectAttempts < int64(want) || r.HerdStoreOps < int64(want) || r.PeakRSSKB <= 0 ||
			r.OwnerRSSKB <= 0 || r.RenewCPUPct <= 0 || r.SteadyStoreOpsPerS <= 0 {
			t.Errorf("%d sessions, %s: %+v", r.Sessions, r.Scenario, r)
		}
	}
	if rep.Scenarios[0].SingleSessionFullS != rep.Single[0].AllFullS {
		t.Errorf("single_session_failure_to_full_s %.3f, want the reference's all_full_s %.3f", rep.Scenarios[0].SingleSessionFullS, rep.Single[0].AllFullS)
	}
	// The keys the issue names are in the JSON.
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"sessions", "sessions_within_budget", "all_full_s", "max_failure_to_full_s", "single_session_failure_to_full_s",
		"budget_s", "lost", "rss_per_session_kb", "renew_cpu_pct", "broker_connect_attempts", "herd_store_ops_per_s", "peak_rss_kb", "loadavg"} {
		if !strings.Contains(string(b), `"`+k+`":`) {
			t.Errorf("the JSON has no %q", k)
		}
	}
}

// TestScaleLabFlags refuses what the scale lab cannot run, naming the flag.
func TestScaleLabFlags(t *testing.T) {
	for _, args := range [][]string{
		{"bridge", "--sessions", "-1"},
		{"bridge", "--sessions", "999999"},
		{"bridge", "--sessions", "3", "--runs", "2"},
		{"bridge", "--sessions", "3,x"},
		{"bridge", "--svg", "plot.svg"},
	} {
		var out, errb bytes.Buffer
		if code := commands.Dispatch(args, &out, &errb); code == 0 || !strings.Contains(errb.String(), "--sessions") {
			t.Errorf("%q: exit %d, stderr %q; want a usage error naming --sessions", args, code, errb.String())
		}
	}
}
