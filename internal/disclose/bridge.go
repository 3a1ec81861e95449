// Package disclose renders what the two daemons disclose about their
// failover arithmetic: the stable JSON objects of `myriarch-bridge budget`
// and `myriarchd budget`, their readable tables, and the flag parsing
// behind them. The docs generator renders its tables from the same
// reports, so the docs cannot say something the binaries do not.
package disclose

import (
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/bridge/activation"
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

func secs(d time.Duration) *float64 {
	v := d.Seconds()
	return &v
}

// NewBridgeReport renders an assessment.
func NewBridgeReport(a failover.Assessment) BridgeReport {
	p := a.Policy
	mode := p.Lease.DeploymentMode
	if mode == "" {
		mode = failover.Standalone
	}
	r := BridgeReport{
		DeploymentMode:       string(mode),
		StartupAllowance:     p.StartupAllowance.Seconds(),
		BrokerHealthStepDown: p.BrokerHealthStepDown.String(),
		Admitted:             a.Admitted(),
		Errors:               failover.ErrorStrings(a.Err),
		Warnings:             append([]string{}, a.Warnings...),
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
		r.Baseline = string(c.Baseline)
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
	r.QueueRoom = q.String()
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

// Seconds formats d as seconds with no trailing zeros, e.g. "1097.5s".
func Seconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
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

// BridgeFlags are the inputs of `myriarch-bridge budget`, as strings so
// that every bad value is reported, not only the first.
type BridgeFlags struct {
	fs                                                                  *flag.FlagSet
	mode, ttl, interval, jitter, callTimeout, poll, mrf, grace, startup *string
	connect, reconcile, unmatched, brokerHealth, slo                    *string
	peakRate, queueLimit                                                *string
	JSON                                                                *bool
}

// NewBridgeFlags defines the flags of `myriarch-bridge budget` on a new
// FlagSet that returns errors instead of exiting.
func NewBridgeFlags(name string, output io.Writer) *BridgeFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(output)
	f := &BridgeFlags{fs: fs}
	f.mode = fs.String("deployment-mode", "standalone", "standalone or clustered: the lease baseline when neither lease TTL nor renew interval is pinned")
	f.ttl = fs.String("lease-ttl", "", "pin lease_ttl (Go duration)")
	f.interval = fs.String("renew-interval", "", "pin renew_interval")
	f.jitter = fs.String("lease-renew-jitter", "", "pin lease_renew_jitter")
	f.callTimeout = fs.String("renew-call-timeout", "", "pin renew_call_timeout")
	f.poll = fs.String("acquire-poll-interval", "", "pin acquire_poll_interval")
	f.mrf = fs.String("max-renew-fails", "", "pin max_renew_fails (integer)")
	f.grace = fs.String("step-down-grace", "", "pin step_down_grace")
	f.startup = fs.String("startup-allowance", "0s", "startup_allowance, within [0s, 10m]")
	f.connect = fs.String("connect-timeout", activation.DefaultMQTTConnectTimeout.String(), "MQTT connect_timeout")
	f.reconcile = fs.String("reconcile-timeout", activation.DefaultMQTTReconcileTimeout.String(), "MQTT reconcile_timeout")
	f.unmatched = fs.String("unmatched-grace", activation.DefaultMQTTUnmatchedGrace.String(), "MQTT unmatched_grace")
	f.brokerHealth = fs.String("broker-health-step-down", "", `"off" or a positive duration; omitted means undeclared`)
	f.slo = fs.String("failover-slo", "", "declared failover objective (Go duration)")
	f.peakRate = fs.String("peak-message-rate", "", "declared peak message rate into the session (msg/s): discloses the messages at risk, rate × worst-case budget")
	f.queueLimit = fs.String("broker-max-queued-messages", "", fmt.Sprintf("the broker's per-session queue limit (0 unlimited); omitted with a rate means %d, the default of mosquitto, EMQX and HiveMQ", failover.DefaultBrokerQueueLimit))
	f.JSON = fs.Bool("json", false, "print the stable JSON object")
	return f
}

// FlagSet exposes the underlying flag set.
func (f *BridgeFlags) FlagSet() *flag.FlagSet { return f.fs }

// Parse parses args and converts every flag, returning the policy and
// one error per bad flag.
func (f *BridgeFlags) Parse(args []string) (failover.SessionPolicy, []string, error) {
	if err := f.fs.Parse(args); err != nil {
		return failover.SessionPolicy{}, nil, err
	}
	if f.fs.NArg() > 0 {
		return failover.SessionPolicy{}, nil, fmt.Errorf("unexpected arguments: %q", f.fs.Args())
	}
	var errs []string
	dur := func(flagName, field, s string, allowZero bool) time.Duration {
		if s == "" {
			return 0
		}
		d, err := time.ParseDuration(s)
		switch {
		case err != nil:
			errs = append(errs, fmt.Sprintf("--%s (%s): %q: not a Go duration such as 30s or 1m30s", flagName, field, s))
		case d < 0:
			errs = append(errs, fmt.Sprintf("--%s (%s): %q: must not be negative", flagName, field, s))
		case d == 0 && !allowZero:
			errs = append(errs, fmt.Sprintf("--%s (%s): %q: must be positive", flagName, field, s))
		}
		return d
	}
	var p failover.SessionPolicy
	mode, err := failover.ParseDeploymentMode(*f.mode)
	if err != nil {
		errs = append(errs, "--deployment-mode: "+err.Error())
	}
	p.Lease = failover.LeaseConfig{
		DeploymentMode:      mode,
		LeaseTTL:            dur("lease-ttl", "lease_ttl", *f.ttl, false),
		RenewInterval:       dur("renew-interval", "renew_interval", *f.interval, false),
		LeaseRenewJitter:    dur("lease-renew-jitter", "lease_renew_jitter", *f.jitter, true),
		RenewCallTimeout:    dur("renew-call-timeout", "renew_call_timeout", *f.callTimeout, false),
		AcquirePollInterval: dur("acquire-poll-interval", "acquire_poll_interval", *f.poll, false),
		StepDownGrace:       dur("step-down-grace", "step_down_grace", *f.grace, false),
	}
	if *f.mrf != "" {
		n, err := strconv.Atoi(*f.mrf)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Sprintf("--max-renew-fails (max_renew_fails): %q: must be a positive integer", *f.mrf))
		}
		p.Lease.MaxRenewFails = n
	}
	p.StartupAllowance = dur("startup-allowance", "startup_allowance", *f.startup, true)
	p.FailoverSLO = dur("failover-slo", "failover_slo", *f.slo, false)
	p.BrokerHealthStepDown, err = failover.ParseBrokerHealthStepDown(*f.brokerHealth)
	if err != nil {
		errs = append(errs, "--broker-health-step-down: "+err.Error())
	}
	connect := dur("connect-timeout", "connect_timeout", *f.connect, false)
	reconcile := dur("reconcile-timeout", "reconcile_timeout", *f.reconcile, false)
	unmatched := dur("unmatched-grace", "unmatched_grace", *f.unmatched, false)
	if len(errs) == 0 {
		p.Activation, err = activation.MQTT(connect, reconcile, unmatched)
		if err != nil {
			errs = append(errs, failover.ErrorStrings(err)...)
		}
	}
	return p, errs, nil
}

// AddQueueRoom parses --peak-message-rate and --broker-max-queued-messages
// and adds the queue-room admission to r; a bad value refuses r.
func (f *BridgeFlags) AddQueueRoom(r *BridgeReport) {
	var errs []string
	rate, limit := 0.0, -1
	if *f.peakRate != "" {
		v, err := strconv.ParseFloat(*f.peakRate, 64)
		if err != nil || v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			errs = append(errs, fmt.Sprintf("--peak-message-rate (peak_message_rate): %q: must be a positive number of messages per second", *f.peakRate))
		}
		rate = v
	}
	if *f.queueLimit != "" {
		n, err := strconv.Atoi(*f.queueLimit)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Sprintf("--broker-max-queued-messages (broker_max_queued_messages): %q: must be 0 (unlimited) or a positive integer", *f.queueLimit))
		}
		limit = n
	}
	if len(errs) > 0 {
		r.Admitted = false
		r.Errors = append(r.Errors, errs...)
		return
	}
	r.WithQueueRoom(failover.AssessQueueRoom(rate, limit, WorstBudget(r.assessment)))
}

// BridgeBudget assesses the flags' policy; input errors refuse it.
func BridgeBudget(p failover.SessionPolicy, inputErrs []string) BridgeReport {
	if len(inputErrs) > 0 {
		r := NewBridgeReport(failover.Assessment{Policy: p})
		r.Admitted = false
		r.Errors = append([]string{}, inputErrs...)
		r.BrokerPathFailover = brokerPathStance(failover.Assessment{Policy: p})
		return r
	}
	return NewBridgeReport(failover.Assess(p))
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
		fmt.Fprintf(tw, "\n%s: %s (%v)\n", title, Seconds(b.Total), b.Total)
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
