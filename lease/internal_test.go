package lease

import (
	"testing"
	"time"

	"github.com/myriarch/myriarch/failover"
)

func TestJitterBounds(t *testing.T) {
	c, _, err := failover.ResolveCadence(failover.LeaseConfig{Baseline: failover.Baseline{Name: "clustered", LeaseTTL: 45 * time.Second,
		RenewInterval: 10 * time.Second, LeaseRenewJitter: time.Second, RenewCallTimeout: 3 * time.Second, StepDownGrace: 5 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Store: nopStore{}, Session: "s", InstanceID: "i", Cadence: c})
	if err != nil {
		t.Fatal(err)
	}
	for range 10000 {
		p := m.pollDelay()
		if p < c.MinJitteredPoll() || p > c.MaxJitteredPoll() {
			t.Fatalf("poll delay %v outside [%v, %v]", p, c.MinJitteredPoll(), c.MaxJitteredPoll())
		}
		far := m.clock.Now().Add(time.Hour)
		r := m.renewDelay(far)
		if r < c.RenewInterval-c.LeaseRenewJitter/2 || r >= c.RenewInterval+c.LeaseRenewJitter/2 {
			t.Fatalf("renew delay %v outside interval ± J/2", r)
		}
		near := m.clock.Now().Add(2 * time.Second)
		if r := m.renewDelay(near); r > 2*time.Second {
			t.Fatalf("renew delay %v past the local deadline", r)
		}
	}
}

func TestLocalDeadlineMargin(t *testing.T) {
	now := time.Now()
	if got := LocalDeadline(now, 100*time.Second).Sub(now); got != 94*time.Second {
		t.Fatalf("LocalDeadline = +%v, want +94s", got)
	}
	// The margin covers the documented clock-rate error on both sides and
	// still leaves the act allowance between the owner's latest stop and
	// the earliest takeover (real time, shares of the TTL).
	latestStop := (1 - DeadlineMargin) / (1 - MaxClockRateError)
	earliestTakeover := 1 / (1 + MaxClockRateError)
	if earliestTakeover-latestStop < ActAllowance {
		t.Fatalf("the owner stops at %.4f·TTL and a standby takes over at %.4f·TTL: less than ActAllowance (%v) apart", latestStop, earliestTakeover, ActAllowance)
	}
}

func TestBootClockAdvances(t *testing.T) {
	c := defaultOwnerClock()
	a := c.Now()
	time.Sleep(20 * time.Millisecond)
	if d := c.Now().Sub(a); d < 20*time.Millisecond || d > 10*time.Second {
		t.Fatalf("owner clock advanced %v over a 20ms sleep", d)
	}
}
