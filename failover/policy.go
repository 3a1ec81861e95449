package failover

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// BrokerHealthStepDown is the tri-state broker_health_step_down setting.
// The zero value is "omitted": the decision was not made.
type BrokerHealthStepDown struct {
	declared bool
	after    time.Duration // 0 with declared means off
}

// BrokerHealthOff is the explicit "off": broker-path failover is disabled
// and an objective covers owner death alone.
var BrokerHealthOff = BrokerHealthStepDown{declared: true}

// BrokerHealthAfter steps an owner down after its broker path stayed
// non-converged for d. d must be positive.
func BrokerHealthAfter(d time.Duration) (BrokerHealthStepDown, error) {
	if d <= 0 {
		return BrokerHealthStepDown{}, fieldErr("BrokerHealthStepDown", d, `must be "off" or a positive duration`)
	}
	return BrokerHealthStepDown{declared: true, after: d}, nil
}

// ParseBrokerHealthStepDown parses "" (omitted), "off", or a positive Go
// duration string.
func ParseBrokerHealthStepDown(s string) (BrokerHealthStepDown, error) {
	switch strings.TrimSpace(s) {
	case "":
		return BrokerHealthStepDown{}, nil
	case "off":
		return BrokerHealthOff, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return BrokerHealthStepDown{}, fieldErr("BrokerHealthStepDown", fmt.Sprintf("%q", s), `must be "off" or a positive duration such as 90s`)
	}
	return BrokerHealthAfter(d)
}

// Declared reports whether the operator answered (off or a duration).
func (b BrokerHealthStepDown) Declared() bool { return b.declared }

// Off reports the explicit off.
func (b BrokerHealthStepDown) Off() bool { return b.declared && b.after == 0 }

// After returns the step-down threshold and whether one is set.
func (b BrokerHealthStepDown) After() (time.Duration, bool) { return b.after, b.after > 0 }

// String is "undeclared", "off" or the duration.
func (b BrokerHealthStepDown) String() string {
	switch {
	case !b.declared:
		return "undeclared"
	case b.after == 0:
		return "off"
	}
	return b.after.String()
}

// SessionPolicy is everything that feeds the lease manager of one exclusive
// session: its lease block, start-up allowance, objective, broker-path
// policy and the transport's activation capability.
type SessionPolicy struct {
	Lease                LeaseConfig
	StartupAllowance     time.Duration
	FailoverSLO          time.Duration // zero: no objective declared
	BrokerHealthStepDown BrokerHealthStepDown
	Activation           Activation
}

// Assessment is the outcome of admitting one session's policy.
type Assessment struct {
	Policy     SessionPolicy
	Cadence    Cadence
	OwnerDeath *Budget // nil when it cannot be computed
	BrokerPath *Budget // nil unless broker_health_step_down is a duration
	Warnings   []string
	// Err joins every reason the policy is refused; nil means admitted.
	Err error
}

// Admitted reports whether the policy passed every rule.
func (a Assessment) Admitted() bool { return a.Err == nil }

// Assess resolves the cadence of p, computes its budgets and admits its
// objective: with failover_slo declared, broker_health_step_down must be
// declared, the activation must be known, the owner-death budget must fit,
// and with a step-down duration the broker-path budget must fit too. A
// budget equal to the objective fits.
func Assess(p SessionPolicy) Assessment {
	a := Assessment{Policy: p}
	var errs []error
	cad, warns, cadErr := ResolveCadence(p.Lease)
	a.Warnings = warns
	if cadErr != nil {
		errs = append(errs, cadErr)
	}
	startupOK := p.StartupAllowance >= 0 && p.StartupAllowance <= MaxStartupAllowance
	if !startupOK {
		errs = append(errs, fieldErr("StartupAllowance", p.StartupAllowance, "must be within [0s, %v]", MaxStartupAllowance))
	}
	if p.FailoverSLO < 0 {
		errs = append(errs, fieldErr("FailoverSLO", p.FailoverSLO, "must be a positive duration"))
	}
	slo := p.FailoverSLO > 0
	if slo && !p.BrokerHealthStepDown.Declared() {
		errs = append(errs, fieldErr("BrokerHealthStepDown", "omitted",
			`FailoverSLO is declared, so BrokerHealthStepDown must be answered: "off" (the objective covers owner death alone) or a positive duration`))
	}
	if slo && !p.Activation.Known {
		errs = append(errs, fieldErr("FailoverSLO", p.FailoverSLO,
			"cannot be admitted: transport %q declares no post-takeover activation bound", p.Activation.Transport))
	}
	if cadErr != nil || !startupOK {
		// Nothing to compute the budgets from.
		a.Err = errors.Join(errs...)
		return a
	}
	// The budgets are disclosed even when a policy rule refuses the
	// session, so that an operator sees how far off the objective is.
	a.Cadence = cad
	if !p.Activation.Known {
		a.Warnings = append(a.Warnings, fmt.Sprintf("transport %q declares no activation bound: no failover budget can be computed", p.Activation.Transport))
		a.Err = errors.Join(errs...)
		return a
	}
	if od, err := OwnerDeathBudget(cad, p.Activation, p.StartupAllowance); err != nil {
		errs = append(errs, fmt.Errorf("owner-death budget: %w", err))
	} else {
		a.OwnerDeath = &od
	}
	if after, ok := p.BrokerHealthStepDown.After(); ok {
		if bp, err := BrokerPathBudget(cad, after, p.Activation, p.StartupAllowance); err != nil {
			errs = append(errs, fmt.Errorf("broker-path budget: %w", err))
		} else {
			a.BrokerPath = &bp
		}
	}
	if slo {
		if a.OwnerDeath != nil && a.OwnerDeath.Total > p.FailoverSLO {
			errs = append(errs, fieldErr("FailoverSLO", p.FailoverSLO,
				"the owner-death budget is %v, above the objective; shorten LeaseTTL, lower the transport timeouts or raise AcquirePollInterval", a.OwnerDeath.Total))
		}
		if a.BrokerPath != nil && a.BrokerPath.Total > p.FailoverSLO {
			errs = append(errs, fieldErr("FailoverSLO", p.FailoverSLO,
				"the broker-path budget is %v, above the objective; lower BrokerHealthStepDown or the terms above", a.BrokerPath.Total))
		}
	}
	a.Err = errors.Join(errs...)
	return a
}
