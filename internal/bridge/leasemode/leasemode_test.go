package leasemode

import (
	"testing"
	"time"

	"github.com/myriarch/myriarch/failover"
)

// The spec's figures: standalone 360s with a derived 680/9 s interval;
// clustered 45s/10s; a pinned TTL leaves the clustered baseline.
func TestBaselines(t *testing.T) {
	for _, c := range []struct {
		mode     Mode
		lc       failover.LeaseConfig
		baseline string
		ttl, iv  time.Duration
		grace    time.Duration
	}{
		{Standalone, failover.LeaseConfig{}, "standalone", 360 * time.Second, 75555555555, 15 * time.Second},
		{Clustered, failover.LeaseConfig{}, "clustered", 45 * time.Second, 10 * time.Second, 5 * time.Second},
		// perAttempt 15s, reserve 5s, interval 10s·8/9.
		{Clustered, failover.LeaseConfig{LeaseTTL: 60 * time.Second}, "standalone", 60 * time.Second, 8888888888, 15 * time.Second},
		{Clustered, failover.LeaseConfig{RenewInterval: 20 * time.Second}, "standalone", 360 * time.Second, 20 * time.Second, 15 * time.Second},
	} {
		cad, _, err := failover.ResolveCadence(c.mode.Lease(c.lc))
		if err != nil || cad.Baseline != c.baseline || cad.LeaseTTL != c.ttl || cad.RenewInterval != c.iv || cad.StepDownGrace != c.grace || cad.MaxRenewFails != 3 {
			t.Errorf("%s %+v: %+v %v", c.mode, c.lc, cad, err)
		}
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]Mode{"": Standalone, "standalone": Standalone, "clustered": Clustered} {
		if m, err := Parse(in); err != nil || m != want {
			t.Errorf("Parse(%q) = %q, %v", in, m, err)
		}
	}
	if _, err := Parse("ha"); err == nil || err.Error() != `"ha": must be standalone or clustered` {
		t.Errorf("Parse(ha): %v", err)
	}
}

// failover's refusals and warnings reach the operator in the bridge's keys.
func TestKeysRenameFailoversWords(t *testing.T) {
	_, _, err := failover.ResolveCadence(Standalone.Lease(failover.LeaseConfig{LeaseTTL: 15 * time.Second}))
	if got := failover.RenameFields(err, Keys); got == nil || got.Error() != "step_down_grace: 15s: must be shorter than lease_ttl (15s)" {
		t.Errorf("renamed error %v", got)
	}
	_, warns, err := failover.ResolveCadence(failover.LeaseConfig{LeaseTTL: 30 * time.Second, RenewInterval: 6 * time.Second,
		LeaseRenewJitter: 4 * time.Second, RenewCallTimeout: 3 * time.Second, StepDownGrace: 5 * time.Second})
	if err != nil || len(warns) != 1 {
		t.Fatalf("warnings %q, %v", warns, err)
	}
	if got := failover.RenameWords(warns[0], Keys); got != "lease_renew_jitter reduced from 4s to 1.999999998s so that max_renew_fails × (renew_interval + lease_renew_jitter/2 + renew_call_timeout) stays below lease_ttl (30s)" {
		t.Errorf("renamed warning %q", got)
	}
}
