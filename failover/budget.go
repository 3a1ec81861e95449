package failover

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Activation is a transport's declared post-takeover activation bound: the
// longest time from winning the lease to ServiceLevelFull. It is one
// aggregate bound; the budgets never add its steps again.
type Activation struct {
	// Transport names the transport ("mqtt").
	Transport string
	// Known is false when the transport does not declare its timing.
	Known bool
	// Bound is the aggregate activation bound; meaningful when Known.
	Bound time.Duration
	// Formula explains Bound for operators.
	Formula string
}

// UnknownActivation is the capability of a transport that declares no bound.
func UnknownActivation(transport string) Activation {
	return Activation{Transport: transport}
}

// ActivationStep is one step of a transport's activation, enforced by the
// transport with its own timeout: Times × Timeout is its share of the bound.
type ActivationStep struct {
	// Name is the transport's word for the timeout (e.g. its config key).
	Name    string
	Times   int64
	Timeout time.Duration
}

// DeclareActivation builds the activation bound of a transport from its
// steps: Σ Times·Timeout. Every timeout must be positive, because the
// transport enforces each step with its own timeout and an unbounded step
// would make the bound false; errors name the step.
func DeclareActivation(transport string, steps ...ActivationStep) (Activation, error) {
	var errs []error
	for _, st := range steps {
		if st.Timeout <= 0 {
			errs = append(errs, fieldErr(st.Name, st.Timeout, "must be a positive duration; the %s activation bound depends on it", transport))
		}
		if st.Times < 1 {
			errs = append(errs, fieldErr(st.Name, st.Times, "must count at least once in the %s activation bound", transport))
		}
	}
	if len(errs) > 0 {
		return Activation{}, errors.Join(errs...)
	}
	var s sum
	terms := make([]string, 0, len(steps))
	for _, st := range steps {
		name := fmt.Sprintf("%d × %s", st.Times, st.Name)
		v, err := mul(name, st.Times, st.Timeout)
		if err != nil {
			return Activation{}, err
		}
		s.add(name, v)
		terms = append(terms, fmt.Sprintf("%s %v", name, st.Timeout))
	}
	if s.err != nil {
		return Activation{}, fmt.Errorf("%s activation bound: %w", transport, s.err)
	}
	return Activation{
		Transport: transport,
		Known:     true,
		Bound:     s.total,
		Formula:   strings.Join(terms, " + "),
	}, nil
}

// Term is one line of a budget: what it is and what it adds.
type Term struct {
	Name  string
	Value time.Duration
	Why   string
}

// Budget is a failover budget: its terms and their total, rounded up to the
// millisecond.
type Budget struct {
	Terms []Term
	Total time.Duration
}

// String renders the budget as one formula line.
func (b Budget) String() string {
	parts := make([]string, len(b.Terms))
	for i, t := range b.Terms {
		parts[i] = fmt.Sprintf("%s %v", t.Name, t.Value)
	}
	return fmt.Sprintf("%v = %s", b.Total, strings.Join(parts, " + "))
}

type builder struct {
	s     sum
	terms []Term
}

func (b *builder) add(name string, d time.Duration, why string) {
	b.s.add(name, d)
	b.terms = append(b.terms, Term{Name: name, Value: d, Why: why})
}

func (b *builder) mul(name string, n int64, d time.Duration, why string) {
	v, err := mul(name, n, d)
	if err != nil {
		if b.s.err == nil {
			b.s.err = err
		}
		return
	}
	b.add(name, v, why)
}

func (b *builder) done() (Budget, error) {
	if b.s.err != nil {
		return Budget{}, b.s.err
	}
	total, err := ceilMillis(b.s.total)
	if err != nil {
		return Budget{}, err
	}
	return Budget{Terms: b.terms, Total: total}, nil
}

func requirePositive(c Cadence, act Activation) error {
	var errs []error
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"LeaseTTL", c.LeaseTTL}, {"AcquirePollInterval", c.AcquirePollInterval}, {"RenewCallTimeout", c.RenewCallTimeout}} {
		if f.d <= 0 {
			errs = append(errs, fieldErr(f.name, f.d, "must be positive to bound failover"))
		}
	}
	if !act.Known {
		errs = append(errs, fieldErr("Activation", act.Transport, "declares no post-takeover activation bound"))
	} else if act.Bound <= 0 {
		errs = append(errs, fieldErr("activation", act.Bound, "must be positive"))
	}
	return errors.Join(errs...)
}

// OwnerDeathBudget is the worst-case time from the owner's death (process,
// node, or its path to the lease store) to the successor's
// ServiceLevelFull:
//
//	lease_ttl
//	+ 2 × max(1ms, ⌈1.25 × acquire_poll_interval⌉)
//	+ (1 + ⌈lease_ttl / min_jittered_poll⌉) × renew_call_timeout
//	+ transport activation
//	+ startup_allowance
func OwnerDeathBudget(c Cadence, act Activation, startupAllowance time.Duration) (Budget, error) {
	if err := requirePositive(c, act); err != nil {
		return Budget{}, err
	}
	var b builder
	b.add("lease_ttl", c.LeaseTTL, "renewals stop; the lease must expire by observation")
	b.mul("2 × max_jittered_poll", 2, c.MaxJitteredPoll(),
		"the first standby poll sets the monotonic baseline, a later one crosses the threshold")
	rounds := 1 + ceilDiv(int64(c.LeaseTTL), int64(c.MinJitteredPoll()))
	b.mul(fmt.Sprintf("%d × renew_call_timeout", rounds), rounds, c.RenewCallTimeout,
		fmt.Sprintf("the baseline Acquire plus ⌈lease_ttl / min_jittered_poll %v⌉ observation calls", c.MinJitteredPoll()))
	b.add("activation", act.Bound, "complete post-takeover transport activation: "+act.Formula)
	b.add("startup_allowance", startupAllowance, "declared start-up allowance")
	return b.done()
}

// BrokerPathBudget is the worst-case time from the active owner's broker
// path crossing broker_health_step_down to the successor's
// ServiceLevelFull, while the lease store stays reachable:
//
//	broker_health_step_down
//	+ renew_interval + lease_renew_jitter/2
//	+ 2 × min(5s, step_down_grace)
//	+ step_down_grace
//	+ 2 × max(1ms, ⌈1.25 × acquire_poll_interval⌉)
//	+ 4 × renew_call_timeout
//	+ transport activation
//	+ startup_allowance
func BrokerPathBudget(c Cadence, stepDown time.Duration, act Activation, startupAllowance time.Duration) (Budget, error) {
	if err := requirePositive(c, act); err != nil {
		return Budget{}, err
	}
	if stepDown <= 0 {
		return Budget{}, fieldErr("BrokerHealthStepDown", stepDown, "must be a positive duration for a broker-path budget")
	}
	var b builder
	b.add("broker_health_step_down", stepDown, "the broker path stays non-converged this long")
	b.add("renew_interval", c.RenewInterval, "one detection round: the threshold is checked at the top of the renew timer")
	b.add("lease_renew_jitter/2", c.LeaseRenewJitter/2, "the longest jittered renew timer of that round")
	b.mul("2 × min(5s, step_down_grace)", 2, c.StepDownPhaseBound(), "bounded source close and bounded lease release")
	b.add("step_down_grace", c.StepDownGrace, "settlement grace")
	b.mul("2 × max_jittered_poll", 2, c.MaxJitteredPoll(), "a standby whose Acquire raced the release waits one more poll")
	b.mul("4 × renew_call_timeout", 4, c.RenewCallTimeout,
		"two store calls in the detection round, two standby Acquire attempts")
	b.add("activation", act.Bound, "complete post-takeover transport activation: "+act.Formula)
	b.add("startup_allowance", startupAllowance, "declared start-up allowance")
	return b.done()
}
