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
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/lab"
	"github.com/myriarch/myriarch/internal/cli"
)

func init() {
	commands.Register(cli.Command{
		Name:    "bridge",
		Summary: "measure failover under owner faults (SIGKILL, broker-path blackhole, SIGSTOP, store partition, unreachable broker) and a planned stop (SIGTERM); report failure-to-full, the planned stop's handover gap, loss, duplicates and stale owners",
		Run:     runLab,
	})
}

// bridgeCommand returns how the lab starts a bridge process: the binary
// at path, refused early with the way to build it when it is missing.
func bridgeCommand(path string) (func(args ...string) *exec.Cmd, error) {
	if path == "" {
		path = defaultBridgeBinary()
	}
	if path == "" {
		return nil, errors.New("--bridge: no myriarch-bridge binary next to this one or on PATH; build one with `go build -o bin/ ./cmd/myriarch-bridge` (make demo does) or name it with --bridge")
	}
	if fi, err := os.Stat(path); err != nil || fi.IsDir() {
		return nil, fmt.Errorf("--bridge %s: must be the myriarch-bridge binary: %v", path, err)
	}
	return func(args ...string) *exec.Cmd { return exec.Command(path, args...) }, nil
}

// defaultBridgeBinary is myriarch-bridge next to this executable, else on
// PATH, else "".
func defaultBridgeBinary() string {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "myriarch-bridge")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p
		}
	}
	if p, err := exec.LookPath("myriarch-bridge"); err == nil {
		return p
	}
	return ""
}

func runLab(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("myriarch-lab bridge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print one JSON object: the config, one result per round and the summary")
	rate := fs.Int("rate", 200, "publisher rate, QoS 1 messages per second")
	keep := fs.String("keep", "", "keep configs and bridge logs in this directory")
	store := fs.String("store", lab.StoreSQLite, "lease store: sqlite, postgres (a throwaway cluster) or etcd (embedded)")
	broker := fs.String("broker", "", "external broker URL (tcp://host:port); \"mosquitto\" starts a local mosquitto with its defaults, \"mosquitto:N\" one with max_queued_messages N; default an embedded broker")
	scenarios := fs.String("scenarios", strings.Join(lab.DemoScenarios, ","), "comma-separated scenarios, or \"all\": "+strings.Join(lab.AllScenarios, ", ")+"; or the destination-outage scenarios (run alone; see --outage): "+strings.Join(lab.OutageScenarios, ", "))
	runs := fs.Int("runs", 0, "run N randomized fault rounds (scenario and timing drawn from --seed) and print one summary line")
	seed := fs.Int64("seed", 1, "seed of the randomized rounds")
	bridgeBin := fs.String("bridge", "", "the myriarch-bridge binary the lab runs (default: next to this binary, else on PATH)")
	queue := fs.Int("broker-queue-limit", 0, "declare the broker's per-session queue limit (and --rate as the peak message rate) and show the admission verdict")
	sessionsFlag := fs.String("sessions", "", "the scale lab: N (or a comma-separated list N1,N2,... run one after another) exclusive sessions per process, each with its own lease and broker connection, a message stream on every one (--rate is then the total over all sessions; default 2 per session, at least 20 and at most 1000), after a one-session reference run; scenarios owner_sigkill and owner_planned_stop")
	leaseTTL := fs.Duration("lease-ttl", 0, "the scale lab: lease_ttl of every session (default 6s)")
	svg := fs.String("svg", "", "the scale lab: write the plot of the runs (herd time, memory per session, CPU against sessions) to this SVG file")
	outage := fs.Duration("outage", 10*time.Second, "destination_outage scenarios: how long the destination broker stays down")
	spoolPasses := fs.String("spool", lab.SpoolBoth, "destination_outage scenarios: both (spool on and off side by side), on or off")
	fsync := fs.String("fsync", "interval", "destination_outage scenarios: the file spool's fsync policy (always, interval, never)")
	pgFsync := fs.Bool("pg-fsync", false, "destination_outage scenarios with --store postgres: run the lab's PostgreSQL with fsync on (each commit waits for the disk, as in production; default off, like the tests' clusters)")
	topics := fs.Int("topics", 4, "destination_outage scenarios: topics the messages are spread over (order is judged per topic)")
	progressEvery := fs.Duration("progress-every", 10*time.Second, "destination_outage scenarios: cadence of the progress lines")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return cli.ExitUsage
	}
	rateSet, scenariosSet := false, false
	fs.Visit(func(f *flag.Flag) {
		rateSet = rateSet || f.Name == "rate"
		scenariosSet = scenariosSet || f.Name == "scenarios"
	})
	var sessions []int
	if *sessionsFlag != "" {
		for f := range strings.SplitSeq(*sessionsFlag, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 || n > lab.MaxScaleSessions || *runs > 0 || *queue > 0 {
				fmt.Fprintf(stderr, "--sessions %q: must be numbers between 1 and %d, without --runs or --broker-queue-limit\n", *sessionsFlag, lab.MaxScaleSessions)
				return cli.ExitUsage
			}
			sessions = append(sessions, n)
		}
	} else if *svg != "" {
		fmt.Fprintln(stderr, "--svg: only with --sessions")
		return cli.ExitUsage
	}
	if fs.NArg() > 0 || *rate <= 0 || *runs < 0 || *queue < 0 {
		fmt.Fprintln(stderr, "usage: myriarch-lab bridge [--bridge PATH] [--json] [--rate N] [--keep DIR] [--store sqlite|postgres|etcd] [--broker URL] [--scenarios LIST|all] [--runs N --seed S] [--broker-queue-limit N]")
		return cli.ExitUsage
	}
	labExec, err := bridgeCommand(*bridgeBin)
	if err != nil {
		fmt.Fprintln(stderr, "myriarch-lab bridge:", err)
		return cli.ExitUsage
	}
	sc := strings.Split(*scenarios, ",")
	if slices.ContainsFunc(sc, lab.IsOutageScenario) {
		if !slices.ContainsFunc(sc, func(s string) bool { return !lab.IsOutageScenario(s) }) && len(sessions) == 0 && *runs == 0 && *queue == 0 {
			return runOutage(lab.OutageOptions{Command: labExec, Scenarios: sc, Store: *store, Rate: *rate, Outage: *outage,
				Topics: *topics, Spool: *spoolPasses, Fsync: *fsync, PostgresFsync: *pgFsync, Dir: *keep, Progress: stderr, ProgressEvery: *progressEvery},
				*broker, *asJSON, stdout, stderr)
		}
		fmt.Fprintf(stderr, "--scenarios %q: %s run alone (without --sessions, --runs or --broker-queue-limit)\n", *scenarios, strings.Join(lab.OutageScenarios, " and "))
		return cli.ExitUsage
	}
	if *scenarios == "all" {
		sc = lab.AllScenarios
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	progress := stderr
	if !*asJSON && *runs == 0 && len(sessions) == 0 {
		fmt.Fprintf(stdout, "Configuration (per instance; each reaches the broker and the lease store through TCP proxies that can cut its path):\n\n%s\n", lab.Config)
		progress = stdout
	}
	brokerURL := *broker
	if name, arg, _ := strings.Cut(*broker, ":"); name == "mosquitto" {
		maxQueued := -1
		if arg != "" {
			n, err := strconv.Atoi(arg)
			if err != nil || n < 0 {
				fmt.Fprintf(stderr, "--broker %q: the queue limit after mosquitto: must be a non-negative integer\n", *broker)
				return cli.ExitUsage
			}
			maxQueued = n
		}
		dir, err := os.MkdirTemp("", "myriarch-lab-mosquitto-")
		if err != nil {
			fmt.Fprintln(stderr, "lab:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		m, err := lab.StartMosquitto(ctx, dir, maxQueued)
		if err != nil {
			fmt.Fprintln(stderr, "lab:", err)
			return 1
		}
		defer m.Close()
		brokerURL = m.URL
	}
	if len(sessions) > 0 {
		var scaleSc []string
		if scenariosSet {
			scaleSc = sc
		}
		scaleRate := 0
		if rateSet {
			scaleRate = *rate
		}
		return runScale(ctx, lab.ScaleOptions{Command: labExec, Store: *store, Broker: brokerURL, Scenarios: scaleSc,
			Rate: scaleRate, LeaseTTL: *leaseTTL, Dir: *keep, Progress: stderr}, sessions, *svg, *asJSON, stdout, stderr)
	}
	rep, err := lab.Run(ctx, lab.Options{Command: labExec, Rate: *rate, Dir: *keep, Progress: progress,
		Store: *store, Broker: brokerURL, Scenarios: sc, Runs: *runs, Seed: *seed, QueueLimit: *queue})
	if err != nil {
		fmt.Fprintln(stderr, "lab:", err)
		if rep == nil {
			return 1
		}
	}
	switch {
	case *asJSON:
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	case *runs > 0:
		fmt.Fprintln(stdout, rep.Line())
	default:
		fmt.Fprintf(stdout, "\nadmission: %s\n", rep.Admission)
		for _, s := range rep.Skipped {
			fmt.Fprintln(stdout, "skipped:", s)
		}
		tw := tabwriter.NewWriter(stdout, 2, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "\nscenario\tbudget_s\tfirst_delivery_s\tfailure_to_full_s\tpublished\tdelivered\tlost\tduplicates (bound)\tstale\treconnects\ttwo_owners\tpass")
		for _, r := range rep.Scenarios {
			fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%.3f\t%d\t%d\t%d\t%d (%d)\t%d\t%d\t%t\t%t\n", r.Scenario, r.BudgetS, r.FaultToFirstDeliveryS, r.FailureToFullS, r.MessagesPublished, r.MessagesDelivered, r.Lost, r.Duplicates, r.DuplicateBound, r.StaleDeliveries, r.OldOwnerReconnects, r.TwoOwners, r.Pass)
		}
		tw.Flush()
		for _, r := range rep.Scenarios {
			if r.HandoverGapS != nil && r.HandoverS != nil && r.ActivationS != nil {
				fmt.Fprintf(stdout, "round %d %s: old owner's last delivery → successor's first %.3fs = handover %.3fs (limit %v) + activation %.3fs\n",
					r.Round, r.Scenario, *r.HandoverGapS, *r.HandoverS, lab.PlannedStopHandover, *r.ActivationS)
			}
		}
		for _, r := range rep.Scenarios {
			for _, p := range r.Problems {
				fmt.Fprintf(stdout, "round %d %s: %s\n", r.Round, r.Scenario, p)
			}
		}
		for _, a := range rep.StoreAnomalies {
			fmt.Fprintln(stdout, "lease store:", a)
		}
	}
	if err != nil || !rep.OK() {
		return 1
	}
	return 0
}

// runOutage runs the destination-outage scenarios. broker "" or
// "mosquitto" starts mosquitto with its default queue limit,
// "mosquitto:N" one with max_queued_messages N, a tcp:// URL uses that
// broker as the source.
func runOutage(opts lab.OutageOptions, broker string, asJSON bool, stdout, stderr io.Writer) int {
	if opts.Outage <= 0 || opts.Topics <= 0 || opts.ProgressEvery <= 0 {
		fmt.Fprintf(stderr, "--outage %v, --topics %d, --progress-every %v: must be positive\n", opts.Outage, opts.Topics, opts.ProgressEvery)
		return cli.ExitUsage
	}
	switch name, arg, _ := strings.Cut(broker, ":"); {
	case broker == "" || broker == "mosquitto":
	case name == "mosquitto":
		n, err := strconv.Atoi(arg)
		if err != nil || n <= 0 {
			fmt.Fprintf(stderr, "--broker %q: the queue limit after mosquitto: must be a positive integer\n", broker)
			return cli.ExitUsage
		}
		opts.SourceQueue = n
	default:
		opts.Source = broker
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := lab.RunOutage(ctx, opts)
	if err != nil {
		fmt.Fprintln(stderr, "lab:", err)
	}
	if rep != nil {
		if asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(rep)
		} else {
			fmt.Fprintf(stdout, "source: %s, load average at start %s\n", rep.Source, rep.Load)
			for _, r := range rep.Rows {
				fmt.Fprintln(stdout, r.Line())
				for _, p := range r.Problems {
					fmt.Fprintf(stdout, "  %s [%s]: %s\n", r.Scenario, r.Spool, p)
				}
			}
		}
	}
	if err != nil || rep == nil || !rep.OK() {
		return 1
	}
	return 0
}

// runScale runs the scale lab once per number of sessions and prints the
// reports: JSON (one object, or an array for a list), or the table of
// docs/bridge.md; svg, when set, receives the plot.
func runScale(ctx context.Context, opts lab.ScaleOptions, sessions []int, svg string, asJSON bool, stdout, stderr io.Writer) int {
	var reps []*lab.ScaleReport
	ok := true
	for _, n := range sessions {
		o := opts
		o.Sessions = n
		if o.Dir != "" {
			o.Dir = filepath.Join(o.Dir, fmt.Sprintf("sessions-%d", n))
		}
		rep, err := lab.RunScale(ctx, o)
		if err != nil {
			fmt.Fprintln(stderr, "lab:", err)
			ok = false
		}
		if rep != nil {
			reps = append(reps, rep)
			ok = ok && rep.OK()
		}
		if ctx.Err() != nil {
			break
		}
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if len(sessions) == 1 && len(reps) == 1 {
			_ = enc.Encode(reps[0])
		} else {
			_ = enc.Encode(reps)
		}
	} else {
		fmt.Fprint(stdout, lab.ScaleTable(reps))
		for _, rep := range reps {
			for _, r := range append(append([]lab.ScaleResult(nil), rep.Single...), rep.Scenarios...) {
				for _, p := range r.Problems {
					fmt.Fprintf(stdout, "%d sessions, %s: %s\n", r.Sessions, r.Scenario, p)
				}
			}
		}
	}
	if svg != "" && len(reps) > 0 {
		if err := os.WriteFile(svg, []byte(lab.ScaleSVG(reps)), 0o644); err != nil {
			fmt.Fprintln(stderr, "lab: --svg:", err)
			ok = false
		}
	}
	if !ok || len(reps) == 0 {
		return 1
	}
	return 0
}
