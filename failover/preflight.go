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

// SourceResult is one input, assessed once.
type SourceResult struct {
	// Input is the index of the input in the slice given to Preflight,
	// so that a caller can map a refusal back to its own field paths.
	Input      int
	Source     string
	SessionID  string
	Assessment Assessment
}

// Divergence is two sources of one session that resolve to different
// lease manager inputs.
type Divergence struct {
	SessionID    string
	First, Other string // the sources
	Input        string // the first differing input, with both values
}

func (d Divergence) Error() string {
	return fmt.Sprintf("session %q: %s and %s disagree on %s; routes that share a session must resolve to the same lease manager inputs",
		d.SessionID, d.First, d.Other, d.Input)
}

// Preflighted is the outcome of Preflight: every input's own assessment,
// the divergences between sources of one session, and the canonical
// sessions (those whose sources all resolve and agree).
type Preflighted struct {
	Sources     []SourceResult // by session ID, then source
	Divergences []Divergence
	Sessions    []CanonicalSession
	err         error
}

// Err joins every refusal: per source (prefixed with session and source)
// and the divergences; nil when every session is canonical and admitted.
func (p Preflighted) Err() error { return p.err }

// FirstInput is the result of the earliest input (lowest Input index) of
// a session, or nil when no input names it.
func (p Preflighted) FirstInput(sessionID string) *SourceResult {
	var best *SourceResult
	for i := range p.Sources {
		r := &p.Sources[i]
		if r.SessionID == sessionID && (best == nil || r.Input < best.Input) {
			best = r
		}
	}
	return best
}

// Preflight assesses every input once and canonicalizes the manager inputs
// of every session that one or more sources name. Sessions are first-wins
// at runtime, so two sources of one session that resolve to different
// lease cadences, objectives, start-up allowances, broker-path policies or
// activation bounds are refused, naming both. Inputs are compared in their
// resolved form, so a pinned value equal to its default is no divergence.
// The result and every error are independent of the order of inputs.
func Preflight(inputs []SessionInput) Preflighted {
	groups := map[string][]int{}
	for i, in := range inputs {
		groups[in.SessionID] = append(groups[in.SessionID], i)
	}
	ids := make([]string, 0, len(groups))
	for id := range groups {
		ids = append(ids, id)
	}
	slices.Sort(ids)

	var res Preflighted
	var errs []error
	for _, id := range ids {
		g := groups[id]
		slices.SortStableFunc(g, func(a, b int) int { return cmp.Compare(inputs[a].Source, inputs[b].Source) })
		var first *canonicalKey
		var firstSrc string
		var assess Assessment
		ok := true
		sources := make([]string, 0, len(g))
		for _, i := range g {
			in := inputs[i]
			sources = append(sources, in.Source)
			a := Assess(in.Policy)
			res.Sources = append(res.Sources, SourceResult{Input: i, Source: in.Source, SessionID: id, Assessment: a})
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
				dv := Divergence{SessionID: id, First: firstSrc, Other: in.Source, Input: d}
				res.Divergences = append(res.Divergences, dv)
				errs = append(errs, dv)
				ok = false
			}
		}
		if ok && first != nil {
			if assess.Err != nil {
				for _, e := range Errs(assess.Err) {
					errs = append(errs, fmt.Errorf("session %q, %s: %w", id, firstSrc, e))
				}
			}
			res.Sessions = append(res.Sessions, CanonicalSession{SessionID: id, Sources: sources, Assessment: assess})
		}
	}
	res.err = errors.Join(errs...)
	return res
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

// input is one resolved manager input: its name, the value that diff
// compares and the value that it shows.
type input struct {
	name         string
	value, shown any
}

// inputs lists the inputs of k in the order diff reports them.
func (k canonicalKey) inputs() []input {
	in := func(name string, v any) input { return input{name, v, v} }
	return []input{
		in("LeaseTTL", k.cad.LeaseTTL),
		in("RenewInterval", k.cad.RenewInterval),
		in("LeaseRenewJitter", k.cad.LeaseRenewJitter),
		in("RenewCallTimeout", k.cad.RenewCallTimeout),
		in("AcquirePollInterval", k.cad.AcquirePollInterval),
		in("MaxRenewFails", k.cad.MaxRenewFails),
		in("StepDownGrace", k.cad.StepDownGrace),
		in("StartupAllowance", k.startup),
		{"FailoverSLO", k.slo, sloString(k.slo)},
		in("BrokerHealthStepDown", k.broker),
		{"transport activation", [3]any{k.actTranspt, k.actKnown, k.actBound}, actString(k)},
	}
}

// diff names the first differing input, or "" when they agree.
func (k canonicalKey) diff(o canonicalKey) string {
	a, b := k.inputs(), o.inputs()
	for i := range a {
		if a[i].value != b[i].value {
			return fmt.Sprintf("%s (%v vs %v)", a[i].name, a[i].shown, b[i].shown)
		}
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
