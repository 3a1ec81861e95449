package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"text/tabwriter"

	"github.com/myriarch/myriarch/internal/bridge/lab"
	"github.com/myriarch/myriarch/internal/cli"
)

func init() {
	commands.Register(cli.Command{
		Name:    "lab",
		Summary: "measure failover: SIGKILL the owner, then blackhole its broker path; report failure-to-full, loss and duplicates",
		Run:     runLab,
	})
}

// labExec starts a bridge process; tests replace it.
var labExec = func(args ...string) *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	return exec.Command(exe, args...)
}

func runLab(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("myriarch-bridge lab", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print one JSON object: the config and one result per scenario")
	rate := fs.Int("rate", 200, "publisher rate, QoS 1 messages per second")
	keep := fs.String("keep", "", "keep configs and bridge logs in this directory")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return cli.ExitUsage
	}
	if fs.NArg() > 0 || *rate <= 0 {
		fmt.Fprintln(stderr, "usage: myriarch-bridge lab [--json] [--rate N] [--keep DIR]")
		return cli.ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	progress := stderr
	if !*asJSON {
		fmt.Fprintf(stdout, "Configuration (per instance; a reaches the broker through a TCP proxy that can blackhole):\n\n%s\n", lab.Config)
		progress = stdout
	}
	rep, err := lab.Run(ctx, lab.Options{Command: labExec, Rate: *rate, Dir: *keep, Progress: progress})
	if err != nil {
		fmt.Fprintln(stderr, "lab:", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		tw := tabwriter.NewWriter(stdout, 2, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "\nscenario\tbudget_s\tfailure_to_full_s\tmessages_published\tmessages_delivered\tlost\tduplicates\towner_exit_code")
		for _, r := range rep.Scenarios {
			fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%d\t%d\t%d\t%d\t%d\n", r.Scenario, r.BudgetS, r.FailureToFullS, r.MessagesPublished, r.MessagesDelivered, r.Lost, r.Duplicates, r.OwnerExitCode)
		}
		tw.Flush()
	}
	for _, r := range rep.Scenarios {
		if r.Lost > 0 || !r.WithinBudget {
			return 1
		}
	}
	return 0
}
