package budget

import (
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/disclose"
	fleetconfig "github.com/myriarch/myriarch/internal/fleet/config"
)

// LeaderFlags are the inputs of `myriarchd budget`.
type LeaderFlags struct {
	fs                         *flag.FlagSet
	timeout, shutdown, preStop *disclose.DurFlag
	JSON                       *bool
}

// LeaderInputs are the values `myriarchd budget` starts from (the loaded
// configuration, or the defaults); flags given explicitly override them.
type LeaderInputs struct {
	LeaderSessionTimeout, ShutdownTimeout, PreStopSleep time.Duration
}

// DefaultLeaderInputs are the shipped defaults.
func DefaultLeaderInputs() LeaderInputs {
	return LeaderInputs{failover.DefaultLeaderSessionTimeout, fleetconfig.DefaultShutdownTimeout, fleetconfig.DefaultPreStopSleep}
}

// NewLeaderFlags defines the flags of `myriarchd budget`, starting from in.
func NewLeaderFlags(name string, in LeaderInputs, output io.Writer) *LeaderFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(output)
	f := &LeaderFlags{
		fs:       fs,
		timeout:  &disclose.DurFlag{Flag: "leader-session-timeout", Field: "ha.leaderSessionTimeout", D: in.LeaderSessionTimeout},
		shutdown: &disclose.DurFlag{Flag: "shutdown-timeout", Field: "server.shutdownTimeout", D: in.ShutdownTimeout},
		preStop:  &disclose.DurFlag{Flag: "pre-stop-sleep", Field: "preStopSleepSeconds", D: in.PreStopSleep, AllowZero: true},
		JSON:     fs.Bool("json", false, "print the stable JSON object"),
	}
	fs.Var(f.timeout, f.timeout.Flag, "ha.leaderSessionTimeout (T), within [10s, 10m]")
	fs.Var(f.shutdown, f.shutdown.Flag, "server.shutdownTimeout")
	fs.Var(f.preStop, f.preStop.Flag, "preStopSleepSeconds of the Helm chart")
	return f
}

// FlagSet exposes the underlying flag set.
func (f *LeaderFlags) FlagSet() *flag.FlagSet { return f.fs }

// Parse parses args and computes the report. A flag error (not a refused
// value) is returned as error.
func (f *LeaderFlags) Parse(args []string) (LeaderReport, error) {
	if err := f.fs.Parse(args); err != nil {
		return LeaderReport{}, err
	}
	if f.fs.NArg() > 0 {
		return LeaderReport{}, fmt.Errorf("unexpected arguments: %q", f.fs.Args())
	}
	var errs []string
	for _, v := range []*disclose.DurFlag{f.timeout, f.shutdown, f.preStop} {
		if err := v.Parse(); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return LeaderReport{Errors: errs}, nil
	}
	return LeaderBudget(f.timeout.D, f.shutdown.D, f.preStop.D), nil
}

// RunLeaderBudget implements `myriarchd budget`, starting from in (the
// loaded configuration); flags given explicitly override it.
func RunLeaderBudget(args []string, in LeaderInputs, stdout, stderr io.Writer) int {
	f := NewLeaderFlags("myriarchd budget", in, stderr)
	r, err := f.Parse(args)
	if err != nil {
		return disclose.FlagError("myriarchd budget", args, err, LeaderReport{Errors: []string{err.Error()}}, stdout, stderr)
	}
	return disclose.Report(*f.JSON, r, func() { WriteLeaderTable(stdout, r) }, r.Errors, r.OK(), stdout, stderr)
}
