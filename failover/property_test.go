package failover

import (
	"errors"
	"testing"
	"time"

	"pgregory.net/rapid"
)

func genDur(lo, hi time.Duration) *rapid.Generator[time.Duration] {
	return rapid.Custom(func(t *rapid.T) time.Duration {
		return time.Duration(rapid.Int64Range(int64(lo), int64(hi)).Draw(t, "d"))
	})
}

type budgetInputs struct {
	c        Cadence
	act      Activation
	startup  time.Duration
	stepDown time.Duration
}

func genInputs(t *rapid.T, hi time.Duration) budgetInputs {
	return budgetInputs{
		c: Cadence{
			LeaseTTL:            genDur(time.Millisecond, hi).Draw(t, "ttl"),
			RenewInterval:       genDur(0, hi).Draw(t, "interval"),
			LeaseRenewJitter:    genDur(0, hi).Draw(t, "jitter"),
			RenewCallTimeout:    genDur(time.Millisecond, hi).Draw(t, "call"),
			AcquirePollInterval: genDur(time.Millisecond, hi).Draw(t, "poll"),
			StepDownGrace:       genDur(0, hi).Draw(t, "grace"),
		},
		act:      Activation{Transport: "t", Known: true, Bound: genDur(time.Millisecond, hi).Draw(t, "act")},
		startup:  genDur(0, hi).Draw(t, "startup"),
		stepDown: genDur(time.Millisecond, hi).Draw(t, "stepdown"),
	}
}

// bump returns a copy of in with one input raised by delta.
func bump(in budgetInputs, which int, delta time.Duration) budgetInputs {
	switch which {
	case 0:
		in.c.LeaseTTL += delta
	case 1:
		in.c.RenewCallTimeout += delta
	case 2:
		in.act.Bound += delta
	case 3:
		in.startup += delta
	case 4:
		in.stepDown += delta
	case 5:
		in.c.RenewInterval += delta
	case 6:
		in.c.LeaseRenewJitter += delta
	case 7:
		in.c.StepDownGrace += delta
	case 8:
		in.c.AcquirePollInterval += delta
	}
	return in
}

// Both budgets never decrease when an input grows. The one exception is
// acquire_poll_interval in the owner-death budget: a longer poll costs a
// boundary but removes observation calls (the spec says so), so it is only
// checked for the broker-path budget.
func TestBudgetMonotone(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genInputs(t, 24*time.Hour)
		which := rapid.IntRange(0, 8).Draw(t, "which")
		delta := genDur(1, time.Hour).Draw(t, "delta")
		out := bump(in, which, delta)
		od0, err0 := OwnerDeathBudget(in.c, in.act, in.startup)
		od1, err1 := OwnerDeathBudget(out.c, out.act, out.startup)
		if skip := overflowed(t, which != 8, err0, err1); skip {
			return
		}
		if which != 8 && od1.Total < od0.Total {
			t.Fatalf("owner-death fell from %v to %v raising input %d by %v", od0.Total, od1.Total, which, delta)
		}
		bp0, err0 := BrokerPathBudget(in.c, in.stepDown, in.act, in.startup)
		bp1, err1 := BrokerPathBudget(out.c, out.stepDown, out.act, out.startup)
		if skip := overflowed(t, true, err0, err1); skip {
			return
		}
		if bp1.Total < bp0.Total {
			t.Fatalf("broker-path fell from %v to %v raising input %d by %v", bp0.Total, bp1.Total, which, delta)
		}
		if od0.Total < in.c.LeaseTTL {
			t.Fatalf("owner-death %v below lease_ttl %v", od0.Total, in.c.LeaseTTL)
		}
	})
}

// overflowed checks that overflow is monotone too (a budget that overflows
// still overflows with a larger input) and reports whether to stop.
func overflowed(t *rapid.T, monotone bool, before, after error) bool {
	for _, err := range []error{before, after} {
		if err != nil && !errors.Is(err, ErrOverflow) {
			t.Fatalf("unexpected error %v", err)
		}
	}
	if monotone && before != nil && after == nil {
		t.Fatalf("overflowed before raising an input, not after: %v", before)
	}
	return before != nil || after != nil
}

// The spec's advice holds: some longer polls shrink the owner-death budget.
func TestLongerPollCanShrinkOwnerDeath(t *testing.T) {
	act := Activation{Known: true, Bound: time.Second}
	c := Cadence{LeaseTTL: 360 * time.Second, RenewCallTimeout: 5 * time.Second, AcquirePollInterval: time.Second}
	a, _ := OwnerDeathBudget(c, act, 0)
	c.AcquirePollInterval = 20 * time.Second
	b, _ := OwnerDeathBudget(c, act, 0)
	if b.Total >= a.Total {
		t.Fatalf("poll 1s → %v, poll 20s → %v", a.Total, b.Total)
	}
}

// Across the whole duration range the budgets are either an error that
// wraps ErrOverflow or a value no smaller than any term: never wrapped.
func TestBudgetOverflowAlwaysAnError(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genInputs(t, time.Duration(1<<63-1))
		for name, f := range map[string]func() (Budget, error){
			"owner-death": func() (Budget, error) { return OwnerDeathBudget(in.c, in.act, in.startup) },
			"broker-path": func() (Budget, error) { return BrokerPathBudget(in.c, in.stepDown, in.act, in.startup) },
		} {
			b, err := f()
			if err != nil {
				if !errors.Is(err, ErrOverflow) {
					t.Fatalf("%s: unexpected error %v", name, err)
				}
				continue
			}
			for _, term := range b.Terms {
				if term.Value < 0 || b.Total < term.Value {
					t.Fatalf("%s: total %v below term %s %v", name, b.Total, term.Name, term.Value)
				}
			}
			if b.Total < in.c.LeaseTTL && name == "owner-death" {
				t.Fatalf("owner-death %v below TTL %v", b.Total, in.c.LeaseTTL)
			}
		}
	})
}

// Resolution never produces a cadence that breaks its own invariant or
// rules, whatever the pinned values.
func TestResolvedCadenceKeepsInvariant(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := LeaseConfig{
			Baseline:            rapid.SampledFrom([]Baseline{{}, standaloneBase, clusteredBase}).Draw(t, "baseline"),
			LeaseTTL:            rapid.SampledFrom([]time.Duration{0, 0, genDur(time.Second, 2*time.Hour).Draw(t, "ttl")}).Draw(t, "ttlp"),
			RenewInterval:       rapid.SampledFrom([]time.Duration{0, 0, genDur(100*time.Millisecond, time.Hour).Draw(t, "iv")}).Draw(t, "ivp"),
			LeaseRenewJitter:    rapid.SampledFrom([]time.Duration{0, genDur(0, time.Hour).Draw(t, "j")}).Draw(t, "jp"),
			RenewCallTimeout:    rapid.SampledFrom([]time.Duration{0, genDur(time.Millisecond, time.Minute).Draw(t, "ct")}).Draw(t, "ctp"),
			AcquirePollInterval: rapid.SampledFrom([]time.Duration{0, genDur(100*time.Millisecond, time.Minute).Draw(t, "p")}).Draw(t, "pp"),
			MaxRenewFails:       rapid.IntRange(0, 10).Draw(t, "mrf"),
			StepDownGrace:       rapid.SampledFrom([]time.Duration{0, genDur(time.Millisecond, time.Minute).Draw(t, "g")}).Draw(t, "gp"),
		}
		c, _, err := ResolveCadence(cfg)
		if err != nil {
			return
		}
		n := time.Duration(c.MaxRenewFails)
		if n*(c.RenewInterval+c.LeaseRenewJitter/2+c.RenewCallTimeout) >= c.LeaseTTL {
			t.Fatalf("invariant broken %+v", c)
		}
		if c.RenewInterval < MinRenewInterval || c.AcquirePollInterval < MinAcquirePollInterval || c.LeaseTTL < MinExclusiveLeaseTTL || c.StepDownGrace >= c.LeaseTTL {
			t.Fatalf("rule broken %+v", c)
		}
	})
}
