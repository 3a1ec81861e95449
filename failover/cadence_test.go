package failover

import (
	"strings"
	"testing"
	"time"
)

func TestResolveCadence(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  LeaseConfig
		want Cadence
		warn string
	}{
		{"standalone baseline", LeaseConfig{Baseline: standaloneBase}, Cadence{Baseline: "standalone", LeaseTTL: 360 * time.Second, RenewInterval: 75555555555, LeaseRenewJitter: 18888888888,
			RenewCallTimeout: 5 * time.Second, AcquirePollInterval: 5 * time.Second, MaxRenewFails: 3, StepDownGrace: 15 * time.Second,
			RenewIntervalDerived: true, LeaseRenewJitterDerived: true, RenewCallTimeoutDerived: true, AcquirePollIntervalDerived: true}, ""},
		{"clustered baseline", LeaseConfig{Baseline: clusteredBase}, Cadence{Baseline: "clustered", LeaseTTL: 45 * time.Second, RenewInterval: 10 * time.Second,
			LeaseRenewJitter: time.Second, RenewCallTimeout: 3 * time.Second, AcquirePollInterval: 5 * time.Second, MaxRenewFails: 3, StepDownGrace: 5 * time.Second,
			AcquirePollIntervalDerived: true}, ""},
		{"pinned TTL on the standalone baseline", LeaseConfig{Baseline: standaloneBase, LeaseTTL: 60 * time.Second},
			// perAttempt 15s, reserve 5s, interval 10s·8/9.
			Cadence{Baseline: "standalone", LeaseTTL: 60 * time.Second, RenewInterval: 8888888888, LeaseRenewJitter: 2222222222, RenewCallTimeout: 4444444444,
				AcquirePollInterval: 5 * time.Second, MaxRenewFails: 3, StepDownGrace: 15 * time.Second,
				RenewIntervalDerived: true, LeaseRenewJitterDerived: true, RenewCallTimeoutDerived: true, AcquirePollIntervalDerived: true}, ""},
		{"clustered override on top of baseline", LeaseConfig{Baseline: clusteredBase, RenewCallTimeout: 2 * time.Second, MaxRenewFails: 2},
			Cadence{Baseline: "clustered", LeaseTTL: 45 * time.Second, RenewInterval: 10 * time.Second, LeaseRenewJitter: time.Second, RenewCallTimeout: 2 * time.Second,
				AcquirePollInterval: 5 * time.Second, MaxRenewFails: 2, StepDownGrace: 5 * time.Second, AcquirePollIntervalDerived: true}, ""},
		{"pinned interval gets no jitter", LeaseConfig{Baseline: standaloneBase, LeaseTTL: 30 * time.Second, RenewInterval: 4 * time.Second},
			Cadence{Baseline: "standalone", LeaseTTL: 30 * time.Second, RenewInterval: 4 * time.Second, RenewCallTimeout: 2 * time.Second,
				AcquirePollInterval: 4 * time.Second, MaxRenewFails: 3, StepDownGrace: 15 * time.Second, RenewCallTimeoutDerived: true, AcquirePollIntervalDerived: true}, ""},
		{"call timeout clamped to 1s", LeaseConfig{Baseline: standaloneBase, LeaseTTL: 10 * time.Second, RenewInterval: time.Second, StepDownGrace: 2 * time.Second},
			Cadence{Baseline: "standalone", LeaseTTL: 10 * time.Second, RenewInterval: time.Second, RenewCallTimeout: time.Second,
				AcquirePollInterval: time.Second, MaxRenewFails: 3, StepDownGrace: 2 * time.Second, RenewCallTimeoutDerived: true, AcquirePollIntervalDerived: true}, ""},
		{"jitter shed to keep the invariant", LeaseConfig{Baseline: standaloneBase, LeaseTTL: 30 * time.Second, RenewInterval: 6 * time.Second, LeaseRenewJitter: 4 * time.Second, RenewCallTimeout: 3 * time.Second, StepDownGrace: 5 * time.Second},
			// limit = ⌈30s/3⌉ − 1ns = 9.999999999s; 6s + 3s fixed leaves half 0.999999999s.
			Cadence{Baseline: "standalone", LeaseTTL: 30 * time.Second, RenewInterval: 6 * time.Second, LeaseRenewJitter: 1999999998, RenewCallTimeout: 3 * time.Second,
				AcquirePollInterval: 5 * time.Second, MaxRenewFails: 3, StepDownGrace: 5 * time.Second, AcquirePollIntervalDerived: true}, "LeaseRenewJitter reduced from 4s to 1.999999998s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, warns, err := ResolveCadence(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("\n got %+v\nwant %+v", got, tc.want)
			}
			if tc.warn == "" && len(warns) > 0 || tc.warn != "" && (len(warns) != 1 || !strings.Contains(warns[0], tc.warn)) {
				t.Fatalf("warnings %q, want %q", warns, tc.warn)
			}
			n := time.Duration(got.MaxRenewFails)
			if n*(got.RenewInterval+got.LeaseRenewJitter/2+got.RenewCallTimeout) >= got.LeaseTTL {
				t.Fatalf("invariant broken: %+v", got)
			}
		})
	}
}

func TestResolveCadenceRejects(t *testing.T) {
	for _, tc := range []struct {
		cfg  LeaseConfig
		want []string
	}{
		{LeaseConfig{Baseline: standaloneBase, LeaseTTL: 4 * time.Second}, []string{"LeaseTTL: 4s: must be at least 5s for an exclusive session"}},
		{LeaseConfig{Baseline: standaloneBase, LeaseTTL: 60 * time.Second, RenewInterval: 200 * time.Millisecond}, []string{"RenewInterval: 200ms: must be at least 250ms"}},
		{LeaseConfig{Baseline: standaloneBase, LeaseTTL: 60 * time.Second, AcquirePollInterval: 100 * time.Millisecond}, []string{"AcquirePollInterval: 100ms: must be at least 250ms"}},
		{LeaseConfig{Baseline: standaloneBase, LeaseTTL: 15 * time.Second}, []string{"StepDownGrace: 15s: must be shorter than LeaseTTL (15s)"}},
		{LeaseConfig{Baseline: standaloneBase, LeaseTTL: 30 * time.Second, RenewInterval: 8 * time.Second, RenewCallTimeout: 3 * time.Second, StepDownGrace: 5 * time.Second},
			[]string{"RenewInterval: 8s: MaxRenewFails (3) × (RenewInterval + RenewCallTimeout 3s) must be below LeaseTTL (30s) even without jitter"}},
		{LeaseConfig{Baseline: standaloneBase, LeaseTTL: -1, RenewInterval: -2, MaxRenewFails: -1},
			[]string{"LeaseTTL: -1ns: must not be negative", "RenewInterval: -2ns: must not be negative", "MaxRenewFails: -1: must not be negative"}},
		{LeaseConfig{Baseline: Baseline{}}, []string{"LeaseTTL: 0s: must be at least 5s for an exclusive session"}},
		{LeaseConfig{Baseline: standaloneBase, LeaseTTL: 6 * time.Second, RenewInterval: 100 * time.Millisecond, AcquirePollInterval: 100 * time.Millisecond, StepDownGrace: 7 * time.Second},
			[]string{"RenewInterval: 100ms", "AcquirePollInterval: 100ms", "StepDownGrace: 7s"}},
	} {
		_, _, err := ResolveCadence(tc.cfg)
		if err == nil {
			t.Errorf("%+v accepted", tc.cfg)
			continue
		}
		got := ErrorStrings(err)
		if len(got) != len(tc.want) {
			t.Errorf("%+v: errors %q, want %d like %q", tc.cfg, got, len(tc.want), tc.want)
			continue
		}
		for i, w := range tc.want {
			if !strings.HasPrefix(got[i], w) {
				t.Errorf("%+v: error %d = %q, want prefix %q", tc.cfg, i, got[i], w)
			}
		}
	}
}
