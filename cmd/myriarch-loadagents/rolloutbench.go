package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
)

func init() {
	commands.Register(cli.Command{
		Name:    "rollout-bench",
		Summary: "measure a rollout to N simulated agents on one replica (time to plan, per wave, DB writes/s, replica CPU)",
		Run:     runRolloutBench,
	})
}

const rolloutBenchUsage = `Usage: myriarch-loadagents rollout-bench [--agents 10000] [--waves 1,10%,50%,100%] [--max-in-progress 1000]
        [--bake 5s] [--interval 2s] [--dsn URL] [--myriarchd PATH]
Starts a private PostgreSQL (unless --dsn names an empty database), one
replica as a child process (myriarchd serve; --myriarchd names the binary,
default: the one next to this program, else the one in PATH), N simulated OpAMP agents
(opamp-go WebSocket clients) in this process, then rolls one revision out
to all of them and prints JSON lines: the time to plan, each wave's time
to apply and to pass its gate, database writes per second and the
replica's CPU.`

func runRolloutBench(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rollout-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, rolloutBenchUsage) }
	n := fs.Int("agents", 10000, "simulated agents")
	waves := fs.String("waves", strings.Join(rollout.DefaultWaves, ","), "waves of the rollout")
	maxIn := fs.Int("max-in-progress", 1000, "max_in_progress of the rollout")
	bake := fs.Duration("bake", 5*time.Second, "bake time of each wave")
	interval := fs.Duration("interval", 2*time.Second, "jobs.rolloutInterval of the replica")
	dsn := fs.String("dsn", "", "PostgreSQL of an empty database; default: a private one")
	bin := fs.String("myriarchd", "", "the myriarchd binary; default: next to this program, else in PATH")
	if err := fs.Parse(args); err != nil {
		return cli.ExitUsage
	}
	if *n < 1 || *n > 15000 {
		fmt.Fprintln(stderr, "rollout-bench: --agents must be within [1, 15000] (the open-file limit of this process)")
		return cli.ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := rolloutBench(ctx, benchOptions{agents: *n, waves: strings.Split(*waves, ","), maxIn: *maxIn, bake: *bake, interval: *interval, dsn: *dsn, myriarchd: *bin},
		stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "rollout-bench:", err)
		return 1
	}
	return 0
}

type benchOptions struct {
	agents   int
	waves    []string
	maxIn    int
	bake     time.Duration
	interval time.Duration
	dsn      string
	// myriarchd is the binary of the replica ("" finds it).
	myriarchd string
}

// findMyriarchd returns the myriarchd binary: the one next to this
// program (a `go build -o bin/ ./cmd/...` layout), else the one in PATH.
func findMyriarchd() (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "myriarchd")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("myriarchd")
	if err != nil {
		return "", fmt.Errorf("no myriarchd binary next to this program or in PATH; name it with --myriarchd: %w", err)
	}
	return p, nil
}

func emitJSON(w io.Writer, v map[string]any) {
	b, _ := json.Marshal(v)
	fmt.Fprintln(w, string(b))
}

func rolloutBench(ctx context.Context, o benchOptions, stdout, stderr io.Writer) error {
	if o.dsn == "" {
		pg, err := pgtest.Start(ctx, pgtest.Options{})
		if err != nil {
			return err
		}
		defer pg.Close()
		o.dsn = pg.DSN("")
	}
	pool, err := pgxpool.New(ctx, o.dsn)
	if err != nil {
		return err
	}
	defer pool.Close()

	// The replica, a child process: its CPU is its own.
	exe := o.myriarchd
	if exe == "" {
		if exe, err = findMyriarchd(); err != nil {
			return err
		}
	}
	const secret = "rollout-bench-secret-0123"
	rep, err := startReplicaProc(ctx, exe, "bench", o.dsn, secret, map[string]string{"jobs.rolloutInterval": o.interval.String()}, stderr)
	if err != nil {
		return err
	}
	defer rep.stop()
	if !fleettest.Eventually(time.Minute, rep.leads) {
		return errors.New("the replica did not start leading")
	}
	httpAddr, opampAddr := rep.httpAddr, rep.opampAddr

	// The agents.
	start := time.Now()
	var ags []*fleettest.Agent
	var mu sync.Mutex
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < o.agents; i += 8 {
				ag, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + opampAddr + "/v1/opamp", Secret: secret,
					Attrs: map[string]string{"role": "bench"}})
				if err != nil {
					failed.Add(1)
					continue
				}
				mu.Lock()
				ags = append(ags, ag)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	defer func() {
		var wg sync.WaitGroup
		for _, ag := range ags {
			wg.Go(func() { _ = ag.Stop(context.Background()) })
		}
		wg.Wait()
	}()
	if failed.Load() > 0 {
		return fmt.Errorf("%d agents did not start", failed.Load())
	}
	count := func(attrs map[string]string) int {
		n, _ := store.CountOnline(ctx, pool, attrs)
		return int(n)
	}
	if !fleettest.Eventually(3*time.Minute, func() bool {
		return count(map[string]string{"role": "bench"}) == o.agents
	}) {
		return fmt.Errorf("only %d of %d agents registered", count(nil), o.agents)
	}
	emitJSON(stdout, map[string]any{"event": "agents_connected", "agents": o.agents, "took_s": time.Since(start).Seconds()})

	st := &store.Store{Pool: pool}
	before, err := benchSample(ctx, pool, "http://"+httpAddr+"/metrics")
	if err != nil {
		return err
	}
	id, err := startBenchRollout(ctx, st, "bench", map[string]string{"role": "bench"}, "receivers: {otlp: {}}\nexporters: {debug: {}}\n",
		rollout.Spec{Waves: o.waves, MaxInProgress: o.maxIn, BakeS: rollout.Secs(o.bake.Seconds())})
	if err != nil {
		return err
	}
	d, err := waitRollout(ctx, st, id, 30*time.Minute)
	if err != nil {
		return err
	}
	after, err := benchSample(ctx, pool, "http://"+httpAddr+"/metrics")
	if err != nil {
		return err
	}
	for _, ev := range rolloutEvents(d, o.agents, o.bake, o.interval) {
		emitJSON(stdout, ev)
	}
	dt := after.at.Sub(before.at).Seconds()
	emitJSON(stdout, map[string]any{"event": "total", "agents": o.agents, "rollout_s": d.FinishedAt.Sub(d.CreatedAt).Seconds(),
		"db_rows_written_per_s": (after.writes - before.writes) / dt, "db_commits_per_s": (after.commits - before.commits) / dt,
		"replica_cpu_cores": (after.cpu - before.cpu) / dt, "replica_rss_mb": after.rss / 1e6, "measured_s": dt})
	return nil
}

type benchSampleT struct {
	at              time.Time
	cpu, rss        float64
	writes, commits float64
}

func benchSample(ctx context.Context, pool *pgxpool.Pool, metrics string) (benchSampleT, error) {
	s := benchSampleT{at: time.Now()}
	err := pool.QueryRow(ctx, `SELECT (tup_inserted + tup_updated + tup_deleted)::float8, xact_commit::float8 FROM pg_stat_database
		WHERE datname = current_database()`).Scan(&s.writes, &s.commits)
	if err != nil {
		return s, err
	}
	sc := bufio.NewScanner(strings.NewReader(scrapeMetrics(metrics)))
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		f, _ := strconv.ParseFloat(val, 64)
		switch name {
		case "process_cpu_seconds_total":
			s.cpu = f
		case "process_resident_memory_bytes":
			s.rss = f
		}
	}
	return s, nil
}

func scrapeMetrics(url string) string {
	resp, err := http.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// startBenchRollout puts configuration name (selecting the agents with
// selector; kept when it exists), adds a revision with body and creates a
// rollout of it with spec. It returns the rollout's id.
func startBenchRollout(ctx context.Context, st *store.Store, name string, selector map[string]string, body string, spec rollout.Spec) (int64, error) {
	if _, err := (configs.Service{Store: st}).Put(ctx, store.ConfigDef{Name: name, Type: configs.TypeYAML, Selector: selector}); err != nil {
		return 0, err
	}
	if _, _, err := (configs.Service{Store: st}).AddRevision(ctx, name, body, "bench", ""); err != nil {
		return 0, err
	}
	ro, err := (rollout.Service{Store: st}).Create(ctx, rollout.Request{Config: name, Spec: spec}, "bench")
	return ro.ID, err
}

// waitRollout waits until rollout id is no longer active and returns its
// detail; a rollout that did not succeed is an error.
func waitRollout(ctx context.Context, st *store.Store, id int64, timeout time.Duration) (rollout.Detail, error) {
	var d rollout.Detail
	var err error
	if !fleettest.Eventually(timeout, func() bool {
		d, err = (rollout.Service{Store: st}).Detail(ctx, id, 1)
		return ctx.Err() != nil || err == nil && !d.Active()
	}) || ctx.Err() != nil {
		return d, fmt.Errorf("rollout %d did not finish within %s: %+v", id, timeout, d.Counts)
	}
	if d.State != rollout.StateSucceeded {
		return d, fmt.Errorf("rollout %s: %s %+v", d.State, d.Reason, d.Counts)
	}
	return d, nil
}

// rolloutEvents are the JSON lines of a finished rollout: its plan, then
// each wave's time to apply and to pass its gate.
func rolloutEvents(d rollout.Detail, agents int, bake, interval time.Duration) []map[string]any {
	evs := []map[string]any{{"event": "planned", "agents": agents, "waves": len(d.WaveProgress),
		"plan_s": d.PlannedAt.Sub(*d.PlanStartedAt).Seconds(), "created_to_planned_s": d.PlannedAt.Sub(d.CreatedAt).Seconds(),
		"rollout_interval_s": interval.Seconds()}}
	for _, w := range d.WaveProgress {
		evs = append(evs, map[string]any{"event": "wave", "wave": w.Wave, "agents": w.Size,
			"apply_s":      w.CompletedAt.Sub(*w.StartedAt).Seconds(),
			"gate_s":       w.GatePassedAt.Sub(*w.CompletedAt).Seconds(),
			"wave_total_s": w.GatePassedAt.Sub(*w.StartedAt).Seconds(), "bake_s": bake.Seconds()})
	}
	return evs
}
