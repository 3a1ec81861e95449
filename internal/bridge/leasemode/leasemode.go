// Package leasemode is the bridge's policy for the lease cadence of an
// exclusive session: its two deployment modes and the baseline each ships
// (docs/failover-budget.md "How the cadence is resolved", step 1). The arithmetic that resolves a
// cadence from a baseline and the pinned values is failover.ResolveCadence.
package leasemode

import (
	"fmt"
	"time"

	"github.com/myriarch/myriarch/failover"
)

// Mode is bridge.deployment_mode.
type Mode string

// The deployment modes. The empty mode means Standalone.
const (
	Standalone Mode = "standalone"
	Clustered  Mode = "clustered"
)

// Parse accepts "standalone", "clustered" or "" (standalone).
func Parse(s string) (Mode, error) {
	switch Mode(s) {
	case "", Standalone:
		return Standalone, nil
	case Clustered:
		return Clustered, nil
	}
	return "", fmt.Errorf("%q: must be standalone or clustered", s)
}

// The baselines of the two modes.
var (
	// ClusteredBaseline applies to deployment_mode clustered when neither
	// lease_ttl nor renew_interval is pinned.
	ClusteredBaseline = failover.Baseline{
		Name:             string(Clustered),
		LeaseTTL:         45 * time.Second,
		RenewInterval:    10 * time.Second,
		LeaseRenewJitter: time.Second,
		RenewCallTimeout: 3 * time.Second,
		MaxRenewFails:    3,
		StepDownGrace:    5 * time.Second,
	}
	// StandaloneBaseline applies otherwise; the missing timings are derived.
	StandaloneBaseline = failover.Baseline{
		Name:          string(Standalone),
		LeaseTTL:      360 * time.Second,
		MaxRenewFails: 3,
		StepDownGrace: 15 * time.Second,
	}
)

// Baseline is the baseline of a session in mode m whose lease_ttl and
// renew_interval are as pinned (0 not pinned): the clustered one only when
// neither is pinned, since its timings fit its own TTL only.
func (m Mode) Baseline(leaseTTL, renewInterval time.Duration) failover.Baseline {
	if m == Clustered && leaseTTL == 0 && renewInterval == 0 {
		return ClusteredBaseline
	}
	return StandaloneBaseline
}

// Lease returns lc with the baseline of mode m.
func (m Mode) Lease(lc failover.LeaseConfig) failover.LeaseConfig {
	lc.Baseline = m.Baseline(lc.LeaseTTL, lc.RenewInterval)
	return lc
}

// Keys maps the fields of failover.LeaseConfig and failover.SessionPolicy,
// as failover's errors, warnings and divergences name them, onto the
// bridge's route keys (for failover.RenameFields and failover.RenameWords).
var Keys = map[string]string{
	"StartupAllowance":     "startup_allowance",
	"FailoverSLO":          "failover_slo",
	"BrokerHealthStepDown": "broker_health_step_down",
	"LeaseTTL":             "lease_ttl",
	"RenewInterval":        "renew_interval",
	"LeaseRenewJitter":     "lease_renew_jitter",
	"RenewCallTimeout":     "renew_call_timeout",
	"AcquirePollInterval":  "acquire_poll_interval",
	"MaxRenewFails":        "max_renew_fails",
	"StepDownGrace":        "step_down_grace",
}
