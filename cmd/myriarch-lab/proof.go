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
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/lab"
	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/proof"
)

func init() {
	commands.Register(cli.Command{
		Name:    "proof",
		Summary: "run a resumable, seeded proof campaign of randomized bridge and leader failover rounds; write rounds.jsonl and index.html with plots to --dir",
		Run:     runProof,
	})
}

func runProof(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("myriarch-lab proof", flag.ContinueOnError)
	fs.SetOutput(stderr)
	size := fs.String("size", "smoke", "campaign size: smoke, medium or full")
	dir := fs.String("dir", "", "report directory; rerun with the same one to continue a stopped campaign (default proof-SIZE)")
	seed := fs.Int64("seed", 0, "campaign seed (default: from the clock, printed)")
	stores := fs.String("stores", strings.Join(lab.Stores, ","), "bridge lease stores, comma-separated: sqlite, postgres, etcd")
	noLeader := fs.Bool("no-leader", false, "leave out myriarchd's leader rounds")
	parallel := fs.Int("parallel", 0, "batches at once, each with its own ports, store and broker (default: the size's)")
	bridgeRounds := fs.Int("bridge-rounds", -1, "override the size's bridge rounds per store")
	leaderRounds := fs.Int("leader-rounds", -1, "override the size's leader rounds")
	replay := fs.Int64("replay", -1, "rerun the one round this seed names (printed per round), alone, and print its line")
	budget := fs.Duration("time-budget", 0, "stop starting batches after this long (a rerun continues); 0: no limit")
	bridgeBin := fs.String("bridge", "", "the myriarch-bridge binary (default: next to this binary, else on PATH)")
	quiet := fs.Bool("q", false, "no progress lines on stderr")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return cli.ExitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "myriarch-lab proof: unexpected arguments %q\n", fs.Args())
		return cli.ExitUsage
	}
	sz, ok := proof.Sizes[*size]
	if !ok {
		fmt.Fprintf(stderr, "myriarch-lab proof: --size %q: must be smoke, medium or full\n", *size)
		return cli.ExitUsage
	}
	if *parallel < 0 || *parallel > 32 {
		fmt.Fprintf(stderr, "myriarch-lab proof: --parallel %d: must be within [1, 32]\n", *parallel)
		return cli.ExitUsage
	}
	if *bridgeRounds >= 0 {
		sz.BridgePerStore = *bridgeRounds
	}
	if *leaderRounds >= 0 {
		sz.Leader = *leaderRounds
	}
	var sts []string
	for _, s := range strings.Split(*stores, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if !slices.Contains(lab.Stores, s) {
			fmt.Fprintf(stderr, "myriarch-lab proof: --stores: %q: must be one of %s\n", s, strings.Join(lab.Stores, ", "))
			return cli.ExitUsage
		}
		sts = append(sts, s)
	}
	if len(sts) == 0 && sz.BridgePerStore > 0 {
		fmt.Fprintln(stderr, "myriarch-lab proof: --stores: at least one store")
		return cli.ExitUsage
	}
	if *seed == 0 {
		*seed = time.Now().UnixNano() & (1<<40 - 1)
	}
	if *dir == "" {
		*dir = "proof-" + sz.Name
		if *replay >= 0 {
			*dir = fmt.Sprintf("proof-replay-%d", *replay)
		}
	}
	labExec, err := bridgeCommand(*bridgeBin)
	if err != nil && (sz.BridgePerStore > 0 || *replay >= 0) {
		fmt.Fprintln(stderr, "myriarch-lab proof:", err)
		return cli.ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var progress io.Writer = stderr
	if *quiet {
		progress = io.Discard
	}
	o := proof.Options{Dir: *dir, Seed: *seed, Size: sz, Stores: sts, NoLeader: *noLeader, Parallel: *parallel,
		BridgeCommand: labExec, Progress: progress, Budget: *budget}
	if *replay >= 0 {
		rec, err := proof.Replay(ctx, *replay, o)
		if err != nil {
			fmt.Fprintln(stderr, "myriarch-lab proof --replay:", err)
			return 1
		}
		b, _ := json.Marshal(rec)
		fmt.Fprintf(stdout, "%s\n", b)
		if rec.Verdict != proof.Pass {
			return 1
		}
		return 0
	}
	fin, err := proof.Run(ctx, o)
	if err != nil {
		fmt.Fprintln(stderr, "myriarch-lab proof:", err)
	}
	if fin.Report != "" {
		if abs, aerr := filepath.Abs(fin.Report); aerr == nil {
			fin.Report = abs
		}
		b, _ := json.Marshal(fin)
		fmt.Fprintf(stdout, "%s\n", b)
	}
	if err != nil || !fin.OK() || fin.Rounds < fin.Planned-fin.Skipped {
		return 1
	}
	return 0
}
