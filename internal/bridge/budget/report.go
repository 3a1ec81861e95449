// Package budget is what myriarch-bridge discloses about its failover
// arithmetic: the stable JSON object of `myriarch-bridge budget` (also each
// session of `check` and the bridge's /status), its readable table, and
// the command's front end (flags, exit statuses). It is called with
// values (an assessment, durations). The docs generator renders its tables
// from the same reports, so the docs cannot say something the binary does
// not.
package budget

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/bridge/leasemode"
	"github.com/myriarch/myriarch/internal/bridge/queueroom"
	"github.com/myriarch/myriarch/internal/disclose"
)

// BridgeReport is the JSON object of `myriarch-bridge budget --json` and,
// with SessionID, of each exclusive session in `myriarch-bridge check`.
// Durations are seconds; a value that cannot be computed is null.
type BridgeReport struct {
	SessionID            string   `json:"session_id,omitempty"`
	DeploymentMode       string   `json:"deployment_mode"`
	Baseline             string   `json:"baseline,omitempty"`
	LeaseTTL             *float64 `json:"lease_ttl_s"`
	RenewInterval        *float64 `json:"renew_interval_s"`
	LeaseRenewJitter     *float64 `json:"lease_renew_jitter_s"`
	RenewCallTimeout     *float64 `json:"renew_call_timeout_s"`
	AcquirePollInterval  *float64 `json:"acquire_poll_interval_s"`
	MinJitteredPoll      *float64 `json:"min_jittered_poll_s"`
	MaxJitteredPoll      *float64 `json:"max_jittered_poll_s"`
	StepDownGrace        *float64 `json:"step_down_grace_s"`
	MaxRenewFails        *int     `json:"max_renew_fails"`
	Activation           *float64 `json:"activation_s"`
	ActivationFormula    string   `json:"activation_formula,omitempty"`
	StartupAllowance     float64  `json:"startup_allowance_s"`
	OwnerDeathBudget     *float64 `json:"owner_death_budget_s"`
	BrokerHealthStepDown any      `json:"broker_health_step_down"`
	BrokerPathBudget     *float64 `json:"broker_path_budget_s"`
	BrokerPathFailover   string   `json:"broker_path_failover"`
	FailoverSLO          *float64 `json:"failover_slo_s"`
	// Queue room: the declared peak rate (msg/s), the broker's
	// per-session queue limit (0 unlimited; assumed when not declared)
	// and rate × worst-case budget; null when no rate is declared.
	PeakMessageRate         *float64 `json:"peak_message_rate"`
	BrokerMaxQueuedMessages *int     `json:"broker_max_queued_messages"`
	BrokerQueueLimitAssumed bool     `json:"broker_queue_limit_assumed"`
	MessagesAtRisk          *int64   `json:"messages_at_risk"`
	QueueRoom               string   `json:"queue_room"`
	Admitted                bool     `json:"admitted"`
	Errors                  []string `json:"errors"`
	Warnings                []string `json:"warnings"`
	assessment              failover.Assessment
}

var secs = disclose.Secs

// renameWords states failover's warnings in the bridge's keys.
func renameWords(ws []string) []string {
	out := []string{}
	for _, w := range ws {
		out = append(out, failover.RenameWords(w, leasemode.Keys))
	}
	return out
}

// NewBridgeReport renders an assessment of a session of a bridge in the
// given deployment mode.
func NewBridgeReport(mode leasemode.Mode, a failover.Assessment) BridgeReport {
	p := a.Policy
	if mode == "" {
		mode = leasemode.Standalone
	}
	r := BridgeReport{
		DeploymentMode:       string(mode),
		StartupAllowance:     p.StartupAllowance.Seconds(),
		BrokerHealthStepDown: p.BrokerHealthStepDown.String(),
		Admitted:             a.Admitted(),
		Errors:               failover.ErrorStrings(failover.RenameFields(a.Err, leasemode.Keys)),
		Warnings:             renameWords(a.Warnings),
		assessment:           a,
	}
	if after, ok := p.BrokerHealthStepDown.After(); ok {
		r.BrokerHealthStepDown = after.Seconds()
	}
	if p.FailoverSLO > 0 {
		r.FailoverSLO = secs(p.FailoverSLO)
	}
	if p.Activation.Known {
		r.Activation = secs(p.Activation.Bound)
		r.ActivationFormula = p.Activation.Formula
	}
	if c := a.Cadence; c.LeaseTTL > 0 {
		r.Baseline = c.Baseline
		r.LeaseTTL = secs(c.LeaseTTL)
		r.RenewInterval = secs(c.RenewInterval)
		r.LeaseRenewJitter = secs(c.LeaseRenewJitter)
		r.RenewCallTimeout = secs(c.RenewCallTimeout)
		r.AcquirePollInterval = secs(c.AcquirePollInterval)
		r.MinJitteredPoll = secs(c.MinJitteredPoll())
		r.MaxJitteredPoll = secs(c.MaxJitteredPoll())
		r.StepDownGrace = secs(c.StepDownGrace)
		n := c.MaxRenewFails
		r.MaxRenewFails = &n
	}
	if a.OwnerDeath != nil {
		r.OwnerDeathBudget = secs(a.OwnerDeath.Total)
	}
	if a.BrokerPath != nil {
		r.BrokerPathBudget = secs(a.BrokerPath.Total)
	}
	r.BrokerPathFailover = brokerPathStance(a)
	r.QueueRoom = failover.QueueRoom{}.String()
	return r
}

// WorstBudget is the larger of the owner-death and broker-path budgets:
// the longest time nobody consumes the session.
func WorstBudget(a failover.Assessment) time.Duration {
	var w time.Duration
	if a.OwnerDeath != nil {
		w = a.OwnerDeath.Total
	}
	if a.BrokerPath != nil {
		w = max(w, a.BrokerPath.Total)
	}
	return w
}

// WithQueueRoom adds the queue-room admission; a queue that cannot hold
// the messages at risk refuses the report.
func (r *BridgeReport) WithQueueRoom(q failover.QueueRoom) {
	r.QueueRoom = queueroom.String(q)
	if q.PeakRate <= 0 {
		return
	}
	rate, limit, risk := q.PeakRate, q.Limit, q.AtRisk
	r.PeakMessageRate, r.BrokerMaxQueuedMessages, r.MessagesAtRisk = &rate, &limit, &risk
	r.BrokerQueueLimitAssumed = q.LimitAssumed
	if q.Err != nil {
		r.Admitted = false
		r.Errors = append(r.Errors, q.Err.Error())
	}
}

// brokerPathStance says in one sentence where broker-path failover stands;
// the bridge logs it at every start.
func brokerPathStance(a failover.Assessment) string {
	b := a.Policy.BrokerHealthStepDown
	switch {
	case b.Off():
		return "off: broker-path failover is disabled; the objective covers owner death alone"
	case !b.Declared():
		return "undeclared: an owner that loses its broker path keeps the lease; no budget covers that failure"
	case a.BrokerPath != nil:
		return fmt.Sprintf("after %v non-converged: budget %v", b, a.BrokerPath.Total)
	}
	return fmt.Sprintf("after %v non-converged: budget not computable", b)
}

// Assessment returns the assessment behind the report.
func (r BridgeReport) Assessment() failover.Assessment { return r.assessment }

// BridgeBudget assesses the flags' policy; input errors refuse it.
func BridgeBudget(mode leasemode.Mode, p failover.SessionPolicy, inputErrs []string) BridgeReport {
	if len(inputErrs) > 0 {
		r := NewBridgeReport(mode, failover.Assessment{Policy: p})
		r.Admitted = false
		r.Errors = append([]string{}, inputErrs...)
		r.BrokerPathFailover = brokerPathStance(failover.Assessment{Policy: p})
		return r
	}
	return NewBridgeReport(mode, failover.Assess(p))
}

// WriteBridgeTable prints the report as a table that explains each term.
func WriteBridgeTable(w io.Writer, r BridgeReport) {
	a := r.assessment
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintf(tw, "Lease cadence (deployment_mode %s", r.DeploymentMode)
	if r.Baseline != "" {
		fmt.Fprintf(tw, ", %s baseline", r.Baseline)
	}
	fmt.Fprintln(tw, ")")
	if c := a.Cadence; c.LeaseTTL > 0 {
		src := func(derived bool) string {
			if derived {
				return "derived"
			}
			return "set"
		}
		fmt.Fprintf(tw, "  lease_ttl\t%v\t\n", c.LeaseTTL)
		fmt.Fprintf(tw, "  renew_interval\t%v\t%s\n", c.RenewInterval, src(c.RenewIntervalDerived))
		fmt.Fprintf(tw, "  lease_renew_jitter\t%v\t%s\n", c.LeaseRenewJitter, src(c.LeaseRenewJitterDerived))
		fmt.Fprintf(tw, "  renew_call_timeout\t%v\t%s\n", c.RenewCallTimeout, src(c.RenewCallTimeoutDerived))
		fmt.Fprintf(tw, "  acquire_poll_interval\t%v\t%s; jittered %v to %v\n", c.AcquirePollInterval, src(c.AcquirePollIntervalDerived), c.MinJitteredPoll(), c.MaxJitteredPoll())
		fmt.Fprintf(tw, "  max_renew_fails\t%d\t\n", c.MaxRenewFails)
		fmt.Fprintf(tw, "  step_down_grace\t%v\t\n", c.StepDownGrace)
	}
	fmt.Fprintf(tw, "  startup_allowance\t%v\t\n", a.Policy.StartupAllowance)
	if a.Policy.Activation.Known {
		fmt.Fprintf(tw, "  activation (%s)\t%v\t%s\n", a.Policy.Activation.Transport, a.Policy.Activation.Bound, a.Policy.Activation.Formula)
	}
	writeBudget := func(title string, b *failover.Budget) {
		if b == nil {
			return
		}
		fmt.Fprintf(tw, "\n%s: %s (%v)\n", title, disclose.Seconds(b.Total), b.Total)
		for _, t := range b.Terms {
			fmt.Fprintf(tw, "  + %s\t%v\t%s\n", t.Name, t.Value, t.Why)
		}
	}
	writeBudget("Owner-death budget (failure detection to successor ServiceLevelFull)", a.OwnerDeath)
	writeBudget("Broker-path budget", a.BrokerPath)
	fmt.Fprintf(tw, "\nbroker_health_step_down: %v (%s)\n", a.Policy.BrokerHealthStepDown, r.BrokerPathFailover)
	if r.FailoverSLO != nil {
		fmt.Fprintf(tw, "failover_slo: %v\n", a.Policy.FailoverSLO)
	} else {
		fmt.Fprintln(tw, "failover_slo: not declared")
	}
	fmt.Fprintf(tw, "queue room: %s\n", r.QueueRoom)
	verdict := "admitted"
	if !r.Admitted {
		verdict = "NOT admitted"
	}
	fmt.Fprintf(tw, "Verdict: %s\n", verdict)
	for _, e := range r.Errors {
		fmt.Fprintf(tw, "  error: %s\n", e)
	}
	for _, wn := range r.Warnings {
		fmt.Fprintf(tw, "  warning: %s\n", wn)
	}
}
