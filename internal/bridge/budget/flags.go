package budget

import (
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/bridge/activation"
	"github.com/myriarch/myriarch/internal/bridge/leasemode"
	"github.com/myriarch/myriarch/internal/bridge/queueroom"
	"github.com/myriarch/myriarch/internal/disclose"
)

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
	f.queueLimit = fs.String("broker-max-queued-messages", "", fmt.Sprintf("the broker's per-session queue limit (0 unlimited); omitted with a rate means %d, the default of mosquitto, EMQX and HiveMQ", queueroom.DefaultLimit))
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
		d, err := disclose.ParseDur(flagName, field, s, allowZero)
		if err != nil {
			errs = append(errs, err.Error())
		}
		return d
	}
	var p failover.SessionPolicy
	mode, err := leasemode.Parse(*f.mode)
	if err != nil {
		errs = append(errs, "--deployment-mode (deployment_mode): "+err.Error())
	}
	p.Lease = mode.Lease(failover.LeaseConfig{
		LeaseTTL:            dur("lease-ttl", "lease_ttl", *f.ttl, false),
		RenewInterval:       dur("renew-interval", "renew_interval", *f.interval, false),
		LeaseRenewJitter:    dur("lease-renew-jitter", "lease_renew_jitter", *f.jitter, true),
		RenewCallTimeout:    dur("renew-call-timeout", "renew_call_timeout", *f.callTimeout, false),
		AcquirePollInterval: dur("acquire-poll-interval", "acquire_poll_interval", *f.poll, false),
		StepDownGrace:       dur("step-down-grace", "step_down_grace", *f.grace, false),
	})
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
		errs = append(errs, "--broker-health-step-down: "+failover.RenameFields(err, leasemode.Keys).Error())
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
	r.WithQueueRoom(queueroom.Assess(rate, limit, WorstBudget(r.Assessment())))
}

// RunBridgeBudget implements `myriarch-bridge budget`. With --json the
// object is printed to stdout whatever the outcome; errors also go to
// stderr; the status is 2 for invalid input or a refused objective.
func RunBridgeBudget(args []string, stdout, stderr io.Writer) int {
	f := NewBridgeFlags("myriarch-bridge budget", stderr)
	p, inputErrs, err := f.Parse(args)
	mode, _ := leasemode.Parse(*f.mode) // refused by Parse
	if err != nil {
		return disclose.FlagError("myriarch-bridge budget", args, err, BridgeBudget(mode, p, []string{err.Error()}), stdout, stderr)
	}
	r := BridgeBudget(mode, p, inputErrs)
	f.AddQueueRoom(&r)
	return disclose.Report(*f.JSON, r, func() { WriteBridgeTable(stdout, r) }, r.Errors, r.Admitted, stdout, stderr)
}
