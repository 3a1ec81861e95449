package failover

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestLeaderKeepaliveDefault(t *testing.T) {
	k, err := DeriveLeaderKeepalive(DefaultLeaderSessionTimeout)
	if err != nil {
		t.Fatal(err)
	}
	want := LeaderKeepalive{
		T: 30 * time.Second, FollowerRetry: 5 * time.Second, FollowerRetryMax: 6 * time.Second, AcquisitionMargin: 1500 * time.Millisecond,
		Detection: 22 * time.Second, KeepalivesIdle: 3 * time.Second, KeepalivesInterval: 3 * time.Second, KeepalivesCount: 6,
		UserTimeout: 19 * time.Second, EarliestDrop: 19 * time.Second, LatestDrop: 22 * time.Second,
		ConfirmInterval: 5 * time.Second, ConfirmTimeout: 10 * time.Second, ResignAfter: 15 * time.Second,
	}
	if k != want {
		t.Fatalf("\n got %+v\nwant %+v", k, want)
	}
	p := k.RuntimeParams(true)
	if p["tcp_keepalives_idle"] != "3" || p["tcp_keepalives_interval"] != "3" || p["tcp_keepalives_count"] != "6" || p["tcp_user_timeout"] != "19000" {
		t.Fatalf("params %v", p)
	}
	if _, ok := k.RuntimeParams(false)["tcp_user_timeout"]; ok {
		t.Fatal("tcp_user_timeout present without user timeout")
	}
	if k.LinuxDropAfter() != 21*time.Second || k.CountDropAfter() != 21*time.Second {
		t.Fatalf("drops linux %v count %v", k.LinuxDropAfter(), k.CountDropAfter())
	}
}

func TestLeaderKeepaliveRange(t *testing.T) {
	for _, d := range []time.Duration{0, 9999 * time.Millisecond, 10*time.Minute + time.Millisecond, -time.Second} {
		_, err := DeriveLeaderKeepalive(d)
		if err == nil || !strings.Contains(err.Error(), "LeaderSessionTimeout") || !strings.Contains(err.Error(), "[10s, 10m0s]") {
			t.Errorf("T=%v: %v", d, err)
		}
	}
}

// TestLeaderKeepaliveModel is the spec's proof (1): for every T from 10s to
// 10m in 1ms steps, a model of the Linux keepalive timer with
// tcp_user_timeout and of a count-based server drops a silent session
// after the leader has given up (T/2) and early enough that detection, the
// longest follower retry and the acquisition margin fit within T.
func TestLeaderKeepaliveModel(t *testing.T) {
	step := time.Millisecond
	if testing.Short() {
		step = 997 * time.Microsecond * 10
	}
	n := 0
	for T := MinLeaderSessionTimeout; T <= MaxLeaderSessionTimeout; T += step {
		k, err := DeriveLeaderKeepalive(T)
		if err != nil {
			t.Fatalf("T=%v: %v", T, err)
		}
		n++
		if k.KeepalivesIdle%time.Second != 0 || k.Detection%time.Second != 0 || k.KeepalivesIdle < time.Second {
			t.Fatalf("T=%v: not whole seconds: %+v", T, k)
		}
		for name, drop := range map[string]time.Duration{"linux": k.LinuxDropAfter(), "count": k.CountDropAfter()} {
			if drop <= k.ResignAfter {
				t.Fatalf("T=%v %s: drop at %v is not after the leader resigned (%v)", T, name, drop, k.ResignAfter)
			}
			if drop < k.EarliestDrop || drop > k.LatestDrop {
				t.Fatalf("T=%v %s: drop at %v outside [%v, %v]", T, name, drop, k.EarliestDrop, k.LatestDrop)
			}
			if total := drop + k.FollowerRetryMax + k.AcquisitionMargin; total > T {
				t.Fatalf("T=%v %s: drop %v + retry %v + margin %v = %v > T", T, name, drop, k.FollowerRetryMax, k.AcquisitionMargin, total)
			}
		}
		if k.ConfirmInterval+k.ConfirmTimeout > k.ResignAfter {
			t.Fatalf("T=%v: confirm %v + timeout %v exceed resign %v", T, k.ConfirmInterval, k.ConfirmTimeout, k.ResignAfter)
		}
	}
	t.Logf("checked %d values of T", n)
}

func TestTerminationGracePeriod(t *testing.T) {
	// The spec's figures: 10 + 2 × 30 + 15 + 5.
	g, err := TerminationGracePeriod(10*time.Second, 30*time.Second, 15*time.Second)
	if err != nil || g != 90*time.Second {
		t.Fatalf("grace %v %v, want 90s", g, err)
	}
	g, err = TerminationGracePeriod(0, 1500*time.Millisecond, 15*time.Second)
	if err != nil || g != 23*time.Second {
		t.Fatalf("grace %v %v, want 23s", g, err)
	}
	if _, err := TerminationGracePeriod(0, 0, 0); err == nil || !strings.Contains(err.Error(), "ShutdownTimeout") {
		t.Fatalf("zero shutdown timeout: %v", err)
	}
	if _, err := TerminationGracePeriod(0, time.Second, -time.Second); err == nil || !strings.Contains(err.Error(), "FinalFlush") {
		t.Fatalf("negative final flush: %v", err)
	}
}

func TestRenameFieldsMapsOntoADaemonsKeys(t *testing.T) {
	_, err := DeriveLeaderKeepalive(time.Second)
	err = RenameFields(err, map[string]string{"LeaderSessionTimeout": "ha.leaderSessionTimeout"})
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "ha.leaderSessionTimeout" || fe.Value != "1s" || !strings.Contains(fe.Rule, "[10s, 10m0s]") {
		t.Fatalf("renamed error %v", err)
	}
	_, err = TerminationGracePeriod(-time.Second, 0, 0)
	if got := RenameFields(err, map[string]string{"PreStopSleep": "preStopSleepSeconds"}); !strings.HasPrefix(got.Error(), "preStopSleepSeconds: -1s: ") {
		t.Fatalf("renamed error %v", got)
	}
	if RenameFields(nil, nil) != nil {
		t.Fatal("nil error renamed to non-nil")
	}
}
