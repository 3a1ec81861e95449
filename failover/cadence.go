package failover

import (
	"cmp"
	"errors"
	"fmt"
	"time"
)

// Limits of the lease cadence (docs/failover-budget.md, "How the cadence is resolved").
const (
	MinExclusiveLeaseTTL   = 5 * time.Second
	MinRenewInterval       = 250 * time.Millisecond
	MinAcquirePollInterval = 250 * time.Millisecond
	MaxStartupAllowance    = 10 * time.Minute
	DefaultMaxRenewFails   = 3

	// maxDerivedCallTimeout caps a derived renew_call_timeout and the
	// reserve kept per renew attempt.
	maxDerivedCallTimeout = 5 * time.Second
	minDerivedCallTimeout = time.Second
	maxDerivedPoll        = 5 * time.Second
)

// Baseline is the lease timing a daemon ships as its default: a
// LeaseConfig's positive pinned values override it, and what neither sets
// is derived (ResolveCadence). The zero Baseline ships nothing, so the TTL
// must be pinned. Daemons choose their baselines by their own policy (the
// bridge: by deployment mode, internal/bridge/leasemode).
type Baseline struct {
	// Name is reported as Cadence.Baseline.
	Name             string
	LeaseTTL         time.Duration
	RenewInterval    time.Duration
	LeaseRenewJitter time.Duration
	RenewCallTimeout time.Duration
	// MaxRenewFails of 0 means DefaultMaxRenewFails.
	MaxRenewFails int
	StepDownGrace time.Duration
}

// LeaseConfig is the lease block of one exclusive session as the operator
// wrote it. A zero value means "not pinned": the baseline or a derivation
// fills it in. Negative values are refused.
type LeaseConfig struct {
	// Baseline is what the cadence starts from.
	Baseline            Baseline
	LeaseTTL            time.Duration
	RenewInterval       time.Duration
	LeaseRenewJitter    time.Duration
	RenewCallTimeout    time.Duration
	AcquirePollInterval time.Duration
	MaxRenewFails       int
	StepDownGrace       time.Duration
}

// Cadence is a resolved lease cadence: every timing the lease manager runs
// with, and where each came from.
type Cadence struct {
	// Baseline names the baseline the resolution started from.
	Baseline            string
	LeaseTTL            time.Duration
	RenewInterval       time.Duration
	LeaseRenewJitter    time.Duration
	RenewCallTimeout    time.Duration
	AcquirePollInterval time.Duration
	MaxRenewFails       int
	StepDownGrace       time.Duration

	RenewIntervalDerived       bool
	LeaseRenewJitterDerived    bool
	RenewCallTimeoutDerived    bool
	AcquirePollIntervalDerived bool
}

// MinJitteredPoll is the shortest standby poll: max(1ms, poll − (poll/2)/2).
func (c Cadence) MinJitteredPoll() time.Duration {
	return max(time.Millisecond, c.AcquirePollInterval-(c.AcquirePollInterval/2)/2)
}

// MaxJitteredPoll is the longest standby poll: max(1ms, ⌈1.25·poll⌉).
func (c Cadence) MaxJitteredPoll() time.Duration {
	p := c.AcquirePollInterval
	return max(time.Millisecond, p+time.Duration(ceilDiv(int64(p), 4)))
}

// StepDownPhaseBound bounds each of the two bounded step-down phases
// (closing the source, releasing the lease): min(5s, step_down_grace).
func (c Cadence) StepDownPhaseBound() time.Duration {
	return min(5*time.Second, c.StepDownGrace)
}

// ResolveCadence resolves cfg into the cadence a lease manager runs with,
// following docs/failover-budget.md "How the cadence is resolved" step by step. It returns warnings
// for adjustments it made (jitter shed to keep the renew invariant) and an
// error joining every rule the configuration breaks. Errors and warnings
// name LeaseConfig's fields (LeaseTTL, ...); a daemon maps them onto its
// keys with RenameFields and RenameWords.
func ResolveCadence(cfg LeaseConfig) (Cadence, []string, error) {
	var errs []error
	neg := func(field string, d time.Duration) {
		if d < 0 {
			errs = append(errs, fieldErr(field, d, "must not be negative"))
		}
	}
	neg("LeaseTTL", cfg.LeaseTTL)
	neg("RenewInterval", cfg.RenewInterval)
	neg("LeaseRenewJitter", cfg.LeaseRenewJitter)
	neg("RenewCallTimeout", cfg.RenewCallTimeout)
	neg("AcquirePollInterval", cfg.AcquirePollInterval)
	neg("StepDownGrace", cfg.StepDownGrace)
	if cfg.MaxRenewFails < 0 {
		errs = append(errs, fieldErr("MaxRenewFails", cfg.MaxRenewFails, "must not be negative"))
	}
	if len(errs) > 0 {
		return Cadence{}, nil, errors.Join(errs...)
	}

	// 1. Baseline, then positive pinned values on top.
	base := cfg.Baseline
	c := Cadence{
		Baseline:            base.Name,
		LeaseTTL:            pick(cfg.LeaseTTL, base.LeaseTTL),
		RenewInterval:       pick(cfg.RenewInterval, base.RenewInterval),
		LeaseRenewJitter:    pick(cfg.LeaseRenewJitter, base.LeaseRenewJitter),
		RenewCallTimeout:    pick(cfg.RenewCallTimeout, base.RenewCallTimeout),
		AcquirePollInterval: cfg.AcquirePollInterval,
		MaxRenewFails:       cfg.MaxRenewFails,
		StepDownGrace:       pick(cfg.StepDownGrace, base.StepDownGrace),
	}
	if c.MaxRenewFails == 0 {
		c.MaxRenewFails = cmp.Or(base.MaxRenewFails, DefaultMaxRenewFails)
	}
	if c.LeaseTTL < MinExclusiveLeaseTTL {
		// The derivations below divide the TTL; stop before they run on
		// a value that is already refused.
		return Cadence{}, nil, fieldErr("LeaseTTL", c.LeaseTTL, "must be at least %v for an exclusive session", MinExclusiveLeaseTTL)
	}

	// 2. renew_interval.
	if c.RenewInterval == 0 {
		perAttempt := time.Duration(3 * int64(c.LeaseTTL) / (4 * int64(c.MaxRenewFails)))
		reserve := min(maxDerivedCallTimeout, perAttempt/2)
		c.RenewInterval = max(time.Millisecond, time.Duration((int64(perAttempt-reserve)*8)/9))
		c.RenewIntervalDerived = true
	}
	// 3. lease_renew_jitter: interval/4 only for a derived interval.
	if c.LeaseRenewJitter == 0 && c.RenewIntervalDerived {
		c.LeaseRenewJitter = c.RenewInterval / 4
		c.LeaseRenewJitterDerived = true
	}
	// 4. renew_call_timeout.
	if c.RenewCallTimeout == 0 {
		c.RenewCallTimeout = min(max(c.RenewInterval/2, minDerivedCallTimeout), maxDerivedCallTimeout)
		c.RenewCallTimeoutDerived = true
	}
	// 6. acquire_poll_interval.
	if c.AcquirePollInterval == 0 {
		c.AcquirePollInterval = max(time.Millisecond, min(c.RenewInterval, c.LeaseTTL/4, maxDerivedPoll))
		c.AcquirePollIntervalDerived = true
	}

	// 7. Rejections.
	if c.RenewInterval < MinRenewInterval {
		errs = append(errs, fieldErr("RenewInterval", c.RenewInterval, "must be at least %v", MinRenewInterval))
	}
	// A derived poll is short only because the interval is; report the cause once.
	if c.AcquirePollInterval < MinAcquirePollInterval && (!c.AcquirePollIntervalDerived || c.RenewInterval >= MinRenewInterval) {
		errs = append(errs, fieldErr("AcquirePollInterval", c.AcquirePollInterval, "must be at least %v", MinAcquirePollInterval))
	}
	if c.StepDownGrace >= c.LeaseTTL {
		errs = append(errs, fieldErr("StepDownGrace", c.StepDownGrace, "must be shorter than LeaseTTL (%v)", c.LeaseTTL))
	}

	// 5. Invariant: max_renew_fails·(interval + jitter/2 + call timeout) < TTL.
	// Jitter is shed first; cutting interval or call timeout is refused.
	var warnings []string
	n := int64(c.MaxRenewFails)
	limit := ceilDiv(int64(c.LeaseTTL), n) - 1 // largest per-round time with n·round < TTL
	fixed := int64(c.RenewInterval) + int64(c.RenewCallTimeout)
	switch {
	case fixed > limit:
		errs = append(errs, fieldErr("RenewInterval", c.RenewInterval,
			"MaxRenewFails (%d) × (RenewInterval + RenewCallTimeout %v) must be below LeaseTTL (%v) even without jitter; lower RenewInterval or RenewCallTimeout, or raise LeaseTTL",
			c.MaxRenewFails, c.RenewCallTimeout, c.LeaseTTL))
	case fixed+int64(c.LeaseRenewJitter/2) > limit:
		half := time.Duration(limit - fixed)
		shed := 2 * half
		warnings = append(warnings, fmt.Sprintf(
			"LeaseRenewJitter reduced from %v to %v so that MaxRenewFails × (RenewInterval + LeaseRenewJitter/2 + RenewCallTimeout) stays below LeaseTTL (%v)",
			c.LeaseRenewJitter, shed, c.LeaseTTL))
		c.LeaseRenewJitter = shed
	}
	if len(errs) > 0 {
		return Cadence{}, nil, errors.Join(errs...)
	}
	return c, warnings, nil
}

func pick(pinned, base time.Duration) time.Duration {
	if pinned > 0 {
		return pinned
	}
	return base
}
