package budgetcmd

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
	timeout, shutdown, preStop *durFlag
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
		timeout:  &durFlag{flag: "leader-session-timeout", field: "ha.leaderSessionTimeout", d: in.LeaderSessionTimeout},
		shutdown: &durFlag{flag: "shutdown-timeout", field: "server.shutdownTimeout", d: in.ShutdownTimeout},
		preStop:  &durFlag{flag: "pre-stop-sleep", field: "preStopSleepSeconds", d: in.PreStopSleep, allowZero: true},
		JSON:     fs.Bool("json", false, "print the stable JSON object"),
	}
	fs.Var(f.timeout, f.timeout.flag, "ha.leaderSessionTimeout (T), within [10s, 10m]")
	fs.Var(f.shutdown, f.shutdown.flag, "server.shutdownTimeout")
	fs.Var(f.preStop, f.preStop.flag, "preStopSleepSeconds of the Helm chart")
	return f
}

// FlagSet exposes the underlying flag set.
func (f *LeaderFlags) FlagSet() *flag.FlagSet { return f.fs }

// Parse parses args and computes the report. A flag error (not a refused
// value) is returned as error.
func (f *LeaderFlags) Parse(args []string) (disclose.LeaderReport, error) {
	if err := f.fs.Parse(args); err != nil {
		return disclose.LeaderReport{}, err
	}
	if f.fs.NArg() > 0 {
		return disclose.LeaderReport{}, fmt.Errorf("unexpected arguments: %q", f.fs.Args())
	}
	var errs []string
	for _, v := range []*durFlag{f.timeout, f.shutdown, f.preStop} {
		if err := v.parse(); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return disclose.LeaderReport{Errors: errs}, nil
	}
	return disclose.LeaderBudget(f.timeout.d, f.shutdown.d, f.preStop.d), nil
}
