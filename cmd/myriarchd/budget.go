package main

import (
	"fmt"
	"io"
	"slices"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/fleet/budget"
	"github.com/myriarch/myriarch/internal/fleet/config"
)

func init() {
	commands.Register(cli.Command{
		Name:    "budget",
		Summary: "derive the leader-session keepalives and the shutdown sizing from the loaded config (-c FILE, MYRIARCH_* env) and flags",
		Run:     runBudget,
	})
}

// runBudget loads the configuration the daemon would run with (the file
// given by -c/--config and the MYRIARCH_* environment) and discloses its
// numbers; explicit flags override it.
func runBudget(args []string, stdout, stderr io.Writer) int {
	file, rest, err := cli.TakeFileFlag(args, "c", "config")
	if err != nil {
		fmt.Fprintln(stderr, "myriarchd budget:", err)
		return cli.ExitUsage
	}
	cfg, err := config.Load(config.Source{File: file, Optional: []string{"database.url", "server.enrollmentSecret"}})
	if err != nil {
		errs := failover.ErrorStrings(err)
		for _, e := range errs {
			fmt.Fprintln(stderr, "error:", e)
		}
		if slices.Contains(rest, "--json") || slices.Contains(rest, "-json") {
			printJSON(stdout, map[string]any{"errors": errs})
		}
		return cli.ExitUsage
	}
	// The loaded values are the starting point; flags given explicitly win.
	in := budget.DefaultLeaderInputs()
	in.LeaderSessionTimeout, in.ShutdownTimeout = cfg.HA.LeaderSessionTimeout, cfg.Server.ShutdownTimeout
	return budget.RunLeaderBudget(rest, in, stdout, stderr)
}
