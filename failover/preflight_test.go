package failover

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPreflight(t *testing.T) {
	act := mustMQTT(t)
	pol := func(l LeaseConfig, slo time.Duration, bh BrokerHealthStepDown) SessionPolicy {
		return SessionPolicy{Lease: l, FailoverSLO: slo, BrokerHealthStepDown: bh, Activation: act}
	}
	inputs := []SessionInput{
		{Source: `routes[0] "a"`, SessionID: "s1", Policy: pol(LeaseConfig{Baseline: standaloneBase}, 0, BrokerHealthStepDown{})},
		// Pinning the default is no divergence.
		{Source: `routes[1] "b"`, SessionID: "s1", Policy: pol(LeaseConfig{Baseline: standaloneBase, LeaseTTL: 360 * time.Second}, 0, BrokerHealthStepDown{})},
		{Source: `routes[2] "c"`, SessionID: "s2", Policy: pol(LeaseConfig{Baseline: clusteredBase}, time.Hour, BrokerHealthOff)},
		{Source: `routes[3] "d"`, SessionID: "s2", Policy: pol(LeaseConfig{Baseline: clusteredBase}, 2*time.Hour, BrokerHealthOff)},
		{Source: `routes[4] "e"`, SessionID: "s3", Policy: pol(LeaseConfig{Baseline: clusteredBase}, 0, BrokerHealthOff)},
		{Source: `routes[5] "f"`, SessionID: "s3", Policy: SessionPolicy{Lease: LeaseConfig{Baseline: clusteredBase}, BrokerHealthStepDown: BrokerHealthOff, Activation: UnknownActivation("mqtt")}},
		{Source: `routes[6] "g"`, SessionID: "s4", Policy: pol(LeaseConfig{Baseline: standaloneBase, LeaseTTL: time.Second}, 0, BrokerHealthStepDown{})},
	}
	wantErrs := []string{
		`session "s2": routes[2] "c" and routes[3] "d" disagree on FailoverSLO (1h0m0s vs 2h0m0s)`,
		`session "s3": routes[4] "e" and routes[5] "f" disagree on transport activation (mqtt 4m0s vs mqtt unknown)`,
		`session "s4", routes[6] "g": LeaseTTL: 1s: must be at least 5s for an exclusive session`,
	}
	var first []CanonicalSession
	for i := range 20 {
		shuffled := slices.Clone(inputs)
		rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		pf := Preflight(shuffled)
		got, err := pf.Sessions, pf.Err()
		if len(pf.Sources) != len(inputs) || len(pf.Divergences) != 2 {
			t.Fatalf("run %d: %d source results and %d divergences, want %d and 2", i, len(pf.Sources), len(pf.Divergences), len(inputs))
		}
		for _, r := range pf.Sources {
			if shuffled[r.Input].Source != r.Source || r.Assessment.Policy != shuffled[r.Input].Policy {
				t.Fatalf("run %d: result %q does not point at its input", i, r.Source)
			}
		}
		if f := pf.FirstInput("s4"); f == nil || f.Source != `routes[6] "g"` || f.Assessment.Admitted() {
			t.Fatalf("run %d: first input of s4 = %+v", i, f)
		}
		msgs := ErrorStrings(err)
		ok := len(msgs) == len(wantErrs)
		for j := 0; ok && j < len(msgs); j++ {
			ok = strings.HasPrefix(msgs[j], wantErrs[j])
		}
		if !ok {
			t.Fatalf("run %d errors:\n%s\nwant:\n%s", i, strings.Join(msgs, "\n"), strings.Join(wantErrs, "\n"))
		}
		if len(got) != 1 || got[0].SessionID != "s1" || len(got[0].Sources) != 2 || got[0].Assessment.Cadence.LeaseTTL != 360*time.Second {
			t.Fatalf("run %d sessions %+v", i, got)
		}
		if i == 0 {
			first = got
		} else if got[0].Sources[0] != first[0].Sources[0] {
			t.Fatalf("order changed the outcome")
		}
	}
}

func TestPreflightEveryInputCompared(t *testing.T) {
	act := mustMQTT(t)
	bh, _ := BrokerHealthAfter(time.Minute)
	base := SessionPolicy{Lease: LeaseConfig{Baseline: clusteredBase}, BrokerHealthStepDown: BrokerHealthOff, FailoverSLO: time.Hour, Activation: act}
	act2, _ := mqttLike(time.Second, time.Second, time.Second)
	for field, mut := range map[string]func(*SessionPolicy){
		"LeaseTTL":             func(p *SessionPolicy) { p.Lease.LeaseTTL = 50 * time.Second },
		"RenewCallTimeout":     func(p *SessionPolicy) { p.Lease.RenewCallTimeout = 2 * time.Second },
		"LeaseRenewJitter":     func(p *SessionPolicy) { p.Lease.LeaseRenewJitter = 2 * time.Second },
		"AcquirePollInterval":  func(p *SessionPolicy) { p.Lease.AcquirePollInterval = 2 * time.Second },
		"MaxRenewFails":        func(p *SessionPolicy) { p.Lease.MaxRenewFails = 2 },
		"StepDownGrace":        func(p *SessionPolicy) { p.Lease.StepDownGrace = 2 * time.Second },
		"StartupAllowance":     func(p *SessionPolicy) { p.StartupAllowance = time.Second },
		"BrokerHealthStepDown": func(p *SessionPolicy) { p.BrokerHealthStepDown = bh },
		"transport activation": func(p *SessionPolicy) { p.Activation = act2 },
	} {
		other := base
		mut(&other)
		err := Preflight([]SessionInput{{Source: "x", SessionID: "s", Policy: base}, {Source: "y", SessionID: "s", Policy: other}}).Err()
		if err == nil || !strings.Contains(err.Error(), "disagree on "+field) {
			t.Errorf("%s: %v", field, err)
		}
	}
}
