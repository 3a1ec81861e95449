package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/leaderlab"
)

func init() {
	commands.Register(cli.Command{
		Name:    "leader",
		Summary: "measure leader failover against a throwaway PostgreSQL (needs root for network-drop)",
		Run:     runFailoverLab,
	})
}

func runFailoverLab(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("myriarch-lab leader", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print one JSON line per scenario")
	t := fs.Duration("leader-session-timeout", failover.DefaultLeaderSessionTimeout, "ha.leaderSessionTimeout (T) of the replicas, within [10s, 10m]")
	only := fs.String("scenarios", strings.Join(leaderlab.Scenarios, ","), "comma-separated scenarios to run")
	verbose := fs.Bool("v", false, "print progress and the replicas' logs on stderr")
	runs := fs.Int("runs", 1, "runs of each scenario; the text output adds the worst of them")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return cli.ExitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "myriarch-lab leader: unexpected arguments %q\n", fs.Args())
		return cli.ExitUsage
	}
	var scenarios []string
	for _, s := range strings.Split(*only, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if !slices.Contains(leaderlab.Scenarios, s) {
			fmt.Fprintf(stderr, "myriarch-lab leader: --scenarios: unknown scenario %q (known: %s)\n", s, strings.Join(leaderlab.Scenarios, ", "))
			return cli.ExitUsage
		}
		scenarios = append(scenarios, s)
	}
	if *runs < 1 {
		fmt.Fprintf(stderr, "myriarch-lab leader: --runs %d: must be at least 1\n", *runs)
		return cli.ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := leaderlab.Options{T: *t}
	if *verbose {
		opts.Log = func(format string, a ...any) { fmt.Fprintf(stderr, format+"\n", a...) }
		opts.ReplicaLog = stderr
	}
	lab, err := leaderlab.New(ctx, opts) // derives the keepalive parameters from T first
	var fe *failover.FieldError
	if errors.As(err, &fe) {
		fmt.Fprintf(stderr, "myriarch-lab leader: --leader-session-timeout %s: %s\n", fe.Value, fe.Rule)
		return cli.ExitUsage
	}
	if err != nil {
		fmt.Fprintf(stderr, "myriarch-lab leader: %v\n", err)
		return 1
	}
	defer lab.Close()
	status := 0
	for _, s := range scenarios {
		worst := -1.0
		ran := 0
		for i := 0; i < *runs && ctx.Err() == nil; i++ {
			r, err := lab.Run(ctx, s)
			if err != nil {
				fmt.Fprintf(stderr, "myriarch-lab leader: %s: %v\n", s, err)
				status = 1
				continue
			}
			if !r.WithinBound() && r.Skipped == "" || r.OverlapDetected {
				status = 1
			}
			if r.Skipped == "" {
				ran++
				worst = max(worst, r.MeasuredFailoverS)
			}
			if *asJSON {
				b, _ := json.Marshal(r)
				fmt.Fprintf(stdout, "%s\n", b)
				continue
			}
			if r.Skipped != "" {
				fmt.Fprintf(stdout, "%-20s skipped: %s\n", r.Scenario, r.Skipped)
				break
			}
			fmt.Fprintf(stdout, "%-20s T=%gs failover %6.3fs  bound %6.3fs  overlap %v\n",
				r.Scenario, r.LeaderSessionTimeoutS, r.MeasuredFailoverS, r.BoundS, r.OverlapDetected)
		}
		if !*asJSON && *runs > 1 && ran > 0 {
			fmt.Fprintf(stdout, "%-20s worst of %d runs: %6.3fs\n", s, ran, worst)
		}
		if ctx.Err() != nil {
			break
		}
	}
	return status
}
