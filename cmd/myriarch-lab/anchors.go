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
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/anchorlab"
	"github.com/myriarch/myriarch/internal/cli"
)

func init() {
	commands.Register(cli.Command{
		Name:    "anchors",
		Summary: "the same singleton workload and faults under etcd's Election, a naive PostgreSQL advisory lock and Myriarch's lease and pgleader (needs root for netns-drop)",
		Run:     runAnchors,
	})
}

func parseList(flagName, v string, known []string) ([]string, error) {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if !slices.Contains(known, s) {
			return nil, fmt.Errorf("%s: unknown value %q (known: %s)", flagName, s, strings.Join(known, ", "))
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s %q: must name at least one of %s", flagName, v, strings.Join(known, ", "))
	}
	return out, nil
}

func runAnchors(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("myriarch-lab anchors", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o anchorlab.Options
	asJSON := fs.Bool("json", false, "print one JSON line per run (and system row) instead of the table")
	reps := fs.Int("reps", 3, "repetitions of each system under each fault")
	systems := fs.String("systems", strings.Join(anchorlab.Systems, ","), "comma-separated systems")
	faults := fs.String("faults", strings.Join(anchorlab.Faults, ","), "comma-separated faults")
	fs.DurationVar(&o.Stop, "stop", 0, "how long SIGSTOP lasts (default 20s)")
	fs.DurationVar(&o.After, "after", 0, "how long to keep watching after SIGCONT or the new leader's first write (default 5s)")
	fs.DurationVar(&o.Timeout, "timeout", 0, "longest wait for a new leader (default 40s)")
	fs.DurationVar(&o.EtcdTTL, "etcd-ttl", 0, "etcd session TTL, whole seconds (default 5s)")
	fs.DurationVar(&o.LeaseTTL, "lease-ttl", 0, "Myriarch lease TTL (default 5s)")
	fs.DurationVar(&o.PGLeaderT, "pgleader-t", 0, "pgleader's leaderSessionTimeout T (default 10s, its minimum)")
	fs.DurationVar(&o.PGPoll, "pg-poll", 0, "the naive advisory lock's poll interval (default 2s)")
	verbose := fs.Bool("v", false, "print progress and the candidates' logs on stderr")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return cli.ExitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "myriarch-lab anchors: unexpected arguments %q\n", fs.Args())
		return cli.ExitUsage
	}
	sys, err := parseList("--systems", *systems, anchorlab.Systems)
	if err == nil {
		var fl []string
		fl, err = parseList("--faults", *faults, anchorlab.Faults)
		*faults = strings.Join(fl, ",")
	}
	if err == nil && *reps < 1 {
		err = fmt.Errorf("--reps %d: must be at least 1", *reps)
	}
	if err != nil {
		fmt.Fprintf(stderr, "myriarch-lab anchors: %v\n", err)
		return cli.ExitUsage
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--stop", o.Stop}, {"--after", o.After}, {"--timeout", o.Timeout}, {"--etcd-ttl", o.EtcdTTL},
		{"--lease-ttl", o.LeaseTTL}, {"--pgleader-t", o.PGLeaderT}, {"--pg-poll", o.PGPoll}} {
		if d.v < 0 {
			fmt.Fprintf(stderr, "myriarch-lab anchors: %s %v: must not be negative\n", d.name, d.v)
			return cli.ExitUsage
		}
	}
	if o.EtcdTTL != 0 && (o.EtcdTTL < time.Second || o.EtcdTTL%time.Second != 0) {
		fmt.Fprintf(stderr, "myriarch-lab anchors: --etcd-ttl %v: must be whole seconds, at least 1s\n", o.EtcdTTL)
		return cli.ExitUsage
	}
	if o.PGLeaderT != 0 {
		var fe *failover.FieldError
		if _, err := failover.DeriveLeaderKeepalive(o.PGLeaderT); errors.As(err, &fe) {
			fmt.Fprintf(stderr, "myriarch-lab anchors: --pgleader-t %s: %s\n", fe.Value, fe.Rule)
			return cli.ExitUsage
		}
	}
	faultList := strings.Split(*faults, ",")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *verbose {
		o.Log = func(format string, a ...any) { fmt.Fprintf(stderr, format+"\n", a...) }
		o.CandidateLog = stderr
	}
	load0 := anchorlab.LoadAvg()
	lab, err := anchorlab.New(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "myriarch-lab anchors: %v\n", err)
		return 1
	}
	defer lab.Close()
	rows, status := []anchorlab.Row{}, 0
	enc := json.NewEncoder(stdout)
	for rep := 1; rep <= *reps && ctx.Err() == nil; rep++ {
		for _, f := range faultList {
			for _, s := range sys {
				if ctx.Err() != nil {
					break
				}
				if s == anchorlab.SystemClientGo && rep > 1 {
					continue
				}
				got, err := lab.Run(ctx, s, f, rep)
				if err != nil {
					fmt.Fprintf(stderr, "myriarch-lab anchors: %s under %s (rep %d): %v\n", s, f, rep, err)
					status = 1
					continue
				}
				for _, r := range got {
					if *asJSON {
						_ = enc.Encode(r)
					} else if *verbose {
						b, _ := json.Marshal(r)
						fmt.Fprintf(stderr, "%s\n", b)
					}
				}
				rows = append(rows, got...)
			}
		}
	}
	load := fmt.Sprintf("%s at the start, %s at the end (%d CPUs)", load0, anchorlab.LoadAvg(), runtime.NumCPU())
	if !*asJSON {
		fmt.Fprintf(stdout, "Anchors: %d repetitions; load average %s.\n\n", *reps, load)
		anchorlab.WriteTable(stdout, anchorlab.Cells(rows))
		fmt.Fprintln(stdout)
	}
	sum := anchorlab.Summarize(rows, *reps, faultList, load)
	if ctx.Err() != nil {
		sum.Error = "interrupted"
		status = 1
	} else if status != 0 {
		sum.Error = "some runs failed (see stderr)"
	}
	_ = enc.Encode(sum)
	return status
}
