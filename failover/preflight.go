package failover

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"
)

// SessionInput is one route's or binding's view of an exclusive session.
type SessionInput struct {
	// Source names where the input came from, e.g. `routes[2] "alarms"`.
	Source    string
	SessionID string
	Policy    SessionPolicy
}

// CanonicalSession is the one policy a shared session runs with.
type CanonicalSession struct {
	SessionID  string
	Sources    []string // sorted
	Assessment Assessment
}

// Preflight canonicalizes the manager inputs of every session that one or
// more routes name. Sessions are first-wins at runtime, so two sources of
// one session that resolve to different lease cadences, objectives,
// start-up allowances, broker-path policies or activation bounds are
// refused, naming both. Inputs are compared in their resolved form, so a
// pinned value equal to its default is no divergence. The result and every
// error are independent of the order of inputs.
func Preflight(inputs []SessionInput) ([]CanonicalSession, error) {
	groups := map[string][]SessionInput{}
	for _, in := range inputs {
		groups[in.SessionID] = append(groups[in.SessionID], in)
	}
	ids := make([]string, 0, len(groups))
	for id := range groups {
		ids = append(ids, id)
	}
	slices.Sort(ids)

	var out []CanonicalSession
	var errs []error
	for _, id := range ids {
		g := groups[id]
		slices.SortStableFunc(g, func(a, b SessionInput) int { return cmp.Compare(a.Source, b.Source) })
		var first *canonicalKey
		var firstSrc string
		var assess Assessment
		ok := true
		sources := make([]string, 0, len(g))
		for _, in := range g {
			sources = append(sources, in.Source)
			a := Assess(in.Policy)
			if a.Cadence.LeaseTTL == 0 {
				// The cadence or start-up allowance is refused; nothing to compare.
				for _, e := range Errs(a.Err) {
					errs = append(errs, fmt.Errorf("session %q, %s: %w", id, in.Source, e))
				}
				ok = false
				continue
			}
			k := keyOf(a)
			if first == nil {
				first, firstSrc, assess = &k, in.Source, a
				continue
			}
			if d := first.diff(k); d != "" {
				errs = append(errs, fmt.Errorf("session %q: %s and %s disagree on %s; routes that share a session must resolve to the same lease manager inputs",
					id, firstSrc, in.Source, d))
				ok = false
			}
		}
		if ok && first != nil {
			if assess.Err != nil {
				for _, e := range Errs(assess.Err) {
					errs = append(errs, fmt.Errorf("session %q, %s: %w", id, firstSrc, e))
				}
			}
			out = append(out, CanonicalSession{SessionID: id, Sources: sources, Assessment: assess})
		}
	}
	return out, errors.Join(errs...)
}

// canonicalKey is every resolved manager input of a session.
type canonicalKey struct {
	cad        Cadence
	startup    time.Duration
	slo        time.Duration
	broker     BrokerHealthStepDown
	actKnown   bool
	actBound   time.Duration
	actTranspt string
}

func keyOf(a Assessment) canonicalKey {
	return canonicalKey{
		cad:        a.Cadence,
		startup:    a.Policy.StartupAllowance,
		slo:        a.Policy.FailoverSLO,
		broker:     a.Policy.BrokerHealthStepDown,
		actKnown:   a.Policy.Activation.Known,
		actBound:   a.Policy.Activation.Bound,
		actTranspt: a.Policy.Activation.Transport,
	}
}

// diff names the first differing input, or "" when they agree.
func (k canonicalKey) diff(o canonicalKey) string {
	d := func(name string, a, b any) string { return fmt.Sprintf("%s (%v vs %v)", name, a, b) }
	switch {
	case k.cad.LeaseTTL != o.cad.LeaseTTL:
		return d("lease_ttl", k.cad.LeaseTTL, o.cad.LeaseTTL)
	case k.cad.RenewInterval != o.cad.RenewInterval:
		return d("renew_interval", k.cad.RenewInterval, o.cad.RenewInterval)
	case k.cad.LeaseRenewJitter != o.cad.LeaseRenewJitter:
		return d("lease_renew_jitter", k.cad.LeaseRenewJitter, o.cad.LeaseRenewJitter)
	case k.cad.RenewCallTimeout != o.cad.RenewCallTimeout:
		return d("renew_call_timeout", k.cad.RenewCallTimeout, o.cad.RenewCallTimeout)
	case k.cad.AcquirePollInterval != o.cad.AcquirePollInterval:
		return d("acquire_poll_interval", k.cad.AcquirePollInterval, o.cad.AcquirePollInterval)
	case k.cad.MaxRenewFails != o.cad.MaxRenewFails:
		return d("max_renew_fails", k.cad.MaxRenewFails, o.cad.MaxRenewFails)
	case k.cad.StepDownGrace != o.cad.StepDownGrace:
		return d("step_down_grace", k.cad.StepDownGrace, o.cad.StepDownGrace)
	case k.startup != o.startup:
		return d("startup_allowance", k.startup, o.startup)
	case k.slo != o.slo:
		return d("failover_slo", sloString(k.slo), sloString(o.slo))
	case k.broker != o.broker:
		return d("broker_health_step_down", k.broker, o.broker)
	case k.actTranspt != o.actTranspt || k.actKnown != o.actKnown || k.actBound != o.actBound:
		return d("transport activation", actString(k), actString(o))
	}
	return ""
}

func sloString(d time.Duration) string {
	if d == 0 {
		return "undeclared"
	}
	return d.String()
}

func actString(k canonicalKey) string {
	if !k.actKnown {
		return k.actTranspt + " unknown"
	}
	return fmt.Sprintf("%s %v", k.actTranspt, k.actBound)
}
