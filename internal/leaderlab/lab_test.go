package leaderlab

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/pgtest"
)

func TestMain(m *testing.M) {
	MaybeRunReplica()
	goleak.VerifyTestMain(m)
}

// testT is ha.leaderSessionTimeout in the tests: the smallest accepted
// value, so that the scenarios stay short.
const testT = 10 * time.Second

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", p)
	return len(p), nil
}

func newLab(t *testing.T) *Lab {
	t.Helper()
	if _, err := pgtest.BinDir(); err != nil && os.Getenv("CI") != "true" {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := Options{T: testT, Log: t.Logf, RequireNetns: os.Getenv("CI") == "true"}
	if testing.Verbose() {
		opts.ReplicaLog = logWriter{t}
	}
	l, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	return l
}

func runScenario(t *testing.T, l *Lab, name string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := l.Run(ctx, name)
	b, _ := json.Marshal(r)
	t.Logf("%s", b)
	if err != nil {
		t.Fatal(err)
	}
	if r.Skipped != "" {
		t.Skip(r.Skipped)
	}
	// The bounds of the hard-failure scenarios (freeze, network drop,
	// SIGSTOP) are the claims under test and have seconds of headroom. The
	// clean handovers (kill -9, crash, planned stop) have a bound of a
	// retry plus a T/20 margin (2.5s at T=10s) that measures scheduling
	// more than safety; on a loaded CI machine a stalled follower may spend
	// the margin, so the test allows slack there and `myriarchd
	// failover-lab` reports the strict comparison.
	slack := 0.0
	switch name {
	case ScenarioKill9, ScenarioCrash, ScenarioPlannedStop:
		slack = 3
	}
	if r.MeasuredFailoverS > r.BoundS+slack {
		t.Errorf("failover took %.3fs, bound %.3fs (+%.0fs slack)", r.MeasuredFailoverS, r.BoundS, slack)
	} else if !r.WithinBound() {
		t.Logf("failover took %.3fs, above the bound %.3fs but within the test's slack", r.MeasuredFailoverS, r.BoundS)
	}
	if r.OverlapDetected || r.StaleWritesCommitted != 0 {
		t.Errorf("overlap: %+v", r)
	}
	return r
}

// Test (3): the lock session's connection freezes (no FIN) while the rest
// of the database stays reachable. The old leader resigns (T/2) and ends
// its session through the pool; the follower leads within T; the old
// leader's fenced writes stop before the new term starts.
func TestLockSessionFreeze(t *testing.T) {
	l := newLab(t)
	r := runScenario(t, l, ScenarioFreeze)
	if r.OldLeaderStoppedS == nil || *r.OldLeaderStoppedS > l.Keepalive().ResignAfter.Seconds()+0.5 {
		t.Errorf("old leader stopped after %v s, want within T/2 = %v", r.OldLeaderStoppedS, l.Keepalive().ResignAfter)
	}
}

// Test (4): a real network failure that the server detects only by its
// keepalives: PostgreSQL, the leader and the follower in three network
// namespaces; all packets between the leader and the server dropped.
func TestNetworkDropNamespaces(t *testing.T) {
	l := newLab(t)
	r := runScenario(t, l, ScenarioNetworkDrop)
	k := l.Keepalive()
	// Polling pg_stat_activity and the jiffies of the kernel make the
	// observation up to a few hundred milliseconds late; ss reports in
	// milliseconds.
	const tol = 400 * time.Millisecond
	drop := time.Duration(*r.ServerDropS * float64(time.Second))
	if drop < k.EarliestDrop-50*time.Millisecond || drop > k.LatestDrop+tol {
		t.Errorf("server dropped the session %v after the last packet, want within [D−I, D] = [%v, %v]", drop, k.EarliestDrop, k.LatestDrop)
	}
}

// Test (5): a frozen leader process (SIGSTOP) keeps its connections; the
// follower ends its lock session when the heartbeat is older than T and
// leads within FrozenLeaderBound; the woken process's writes are rejected.
func TestFrozenLeaderProcess(t *testing.T) {
	l := newLab(t)
	r := runScenario(t, l, ScenarioSigstop)
	if r.StaleWritesRejected == 0 {
		t.Error("the woken leader's job was never rejected by the fence")
	}
}

// Test (6): kill -9, a crash and a planned stop hand over within the
// follower's retry (planned stop: plus the release).
func TestHandover(t *testing.T) {
	l := newLab(t)
	for _, s := range []string{ScenarioKill9, ScenarioCrash, ScenarioPlannedStop} {
		t.Run(s, func(t *testing.T) { runScenario(t, l, s) })
	}
}

func TestUnknownScenario(t *testing.T) {
	l := &Lab{}
	if _, err := l.Run(context.Background(), "nope"); err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}
