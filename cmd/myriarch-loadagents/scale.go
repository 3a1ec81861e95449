package main

// The scale command: a fleet of simulated agents across several myriarchd
// replicas behind HAProxy, fed by several load processes, measured at each
// of a list of fleet sizes, with the operations that touch every agent.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
)

func init() {
	commands.Register(cli.Command{Name: "scale",
		Summary: "a fleet across replicas behind HAProxy, measured per size (memory, CPU, PostgreSQL, rollout, replica and leader kill, revocation storm)",
		Run:     runScale})
}

const scaleUsage = `Usage: myriarch-loadagents scale --agents 1000,10000,50000,100000 --replicas R [--json] [flags]
For each fleet size: starts R myriarchd replicas (the real binary, --myriarchd)
on a private PostgreSQL, one HAProxy and one load process (this program,
re-executed) per --per-process agents (WebSocket agents, every
--http-every-th one polling over plain HTTP), then measures the replicas,
PostgreSQL and a bare opamp-go server holding as many agents as one
replica, and runs a rollout, a replica kill, a leader kill during a
rollout and a revocation storm. Progress goes to stderr; one result per
size goes to stdout (a JSON object per line with --json).`

type scaleOptions struct {
	counts     []int
	replicas   int
	perProc    int
	httpEvery  int
	rate       int
	heartbeat  time.Duration
	poll       time.Duration
	settle     time.Duration
	steady     time.Duration
	maxConns   int
	interval   time.Duration
	waves      []string
	maxIn      int
	bake       time.Duration
	revoke     int
	ops        bool
	bare       bool
	pgTop      int
	myriarchd  string
	dir        string
	jsonOut    bool
	connectMax time.Duration
}

// scaleResult is one fleet size's line of output.
type scaleResult struct {
	Agents         int     `json:"agents"`
	Online         int64   `json:"online"`
	Replicas       int     `json:"replicas"`
	LoadProcesses  int     `json:"load_processes"`
	HTTPAgents     int     `json:"http_agents"`
	KBPerAgent     float64 `json:"kb_per_agent"`
	BareKBPerAgent float64 `json:"bare_kb_per_agent"`
	BareAgents     int     `json:"bare_agents"`
	// ReplicaCPUPct is the mean CPU of one replica at steady state, in
	// percent of one core; the per-agent figure is per 1,000 agents it holds.
	ReplicaCPUPct         float64   `json:"replica_cpu_pct"`
	ReplicaCPUPctPer1k    float64   `json:"replica_cpu_pct_per_1k_agents"`
	BareCPUPctPer1k       float64   `json:"bare_cpu_pct_per_1k_agents"`
	ReplicaAgents         []int64   `json:"replica_agents"`
	ReplicaKBPerAgent     []float64 `json:"replica_kb_per_agent"`
	ReplicaRSSMB          []float64 `json:"replica_rss_mb"`
	PGCPUPct              float64   `json:"pg_cpu_pct"`
	PGConnections         int64     `json:"pg_connections"`
	WritesPerS            float64   `json:"writes_per_s"`
	CommitsPerS           float64   `json:"commits_per_s"`
	NotificationsPerS     float64   `json:"notifications_per_s"`
	ConnectAllS           float64   `json:"connect_all_s"`
	RolloutPlanS          float64   `json:"rollout_plan_s"`
	WaveApplyS            float64   `json:"wave_apply_s"`
	WaveAgents            int       `json:"wave_agents"`
	GateLatencyS          float64   `json:"gate_latency_s"`
	RolloutNotifPerS      float64   `json:"rollout_notifications_per_s"`
	RolloutPGCPUPct       float64   `json:"rollout_pg_cpu_pct"`
	RolloutRevOnce        int       `json:"rollout_rev_once"`
	KilledReplicaAgents   int64     `json:"killed_replica_agents"`
	StaleHTTPOnKilled     int64     `json:"stale_http_on_killed"`
	ReplicaKillAllOnlineS float64   `json:"replica_kill_all_online_s"`
	Lost                  int64     `json:"lost"`
	DoubleCounted         int64     `json:"double_counted"`
	APIOnline             int64     `json:"api_online"`
	LeaderFailoverS       float64   `json:"leader_failover_s"`
	LeaderKillRolloutS    float64   `json:"leader_kill_rollout_done_s"`
	RevisionOnce          int       `json:"leader_kill_rev_once"`
	RevisionDuplicates    int       `json:"leader_kill_rev_duplicates"`
	RevisionMissing       int       `json:"leader_kill_rev_missing"`
	Revoked               int       `json:"revoked"`
	RevokeAllOfflineS     float64   `json:"revoke_all_offline_s"`
	RevokeHTTPOfflineS    float64   `json:"revoke_http_offline_s"`
	RevokeStillOnline     int64     `json:"revoke_still_online"`
	FinalOnline           int64     `json:"final_online"`
	LoadAvg               []float64 `json:"load_avg"`
	PGTop                 []pgStmt  `json:"pg_top,omitempty"`
	Errors                []string  `json:"errors,omitempty"`
}

type pgStmt struct {
	Query   string  `json:"query"`
	Calls   int64   `json:"calls"`
	TotalMS float64 `json:"total_ms"`
	Rows    int64   `json:"rows"`
}

func runScale(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, scaleUsage); fs.PrintDefaults() }
	var o scaleOptions
	counts := fs.String("agents", "1000,10000", "comma-separated fleet sizes")
	fs.IntVar(&o.replicas, "replicas", 2, "myriarchd replicas")
	fs.IntVar(&o.perProc, "per-process", 8000, "agents per load process (and per HAProxy instance: two descriptors per agent)")
	fs.IntVar(&o.httpEvery, "http-every", 10, "every Nth agent polls over plain HTTP instead of WebSocket (0: none)")
	fs.IntVar(&o.rate, "rate", 1000, "agents started per second, all load processes together")
	fs.DurationVar(&o.heartbeat, "heartbeat", 30*time.Second, "WebSocket heartbeat interval")
	fs.DurationVar(&o.poll, "poll", 10*time.Second, "plain-HTTP poll interval")
	fs.DurationVar(&o.settle, "settle", 10*time.Second, "wait after all agents are online before measuring")
	fs.DurationVar(&o.steady, "steady", 30*time.Second, "steady-state measurement window")
	fs.IntVar(&o.maxConns, "max-conns", 20, "database.maxConns of each replica")
	fs.DurationVar(&o.interval, "interval", time.Second, "jobs.rolloutInterval of the replicas")
	waves := fs.String("waves", "1,10%,50%,100%", "waves of the rollouts")
	fs.IntVar(&o.maxIn, "max-in-progress", 50000, "max_in_progress of the rollouts")
	fs.DurationVar(&o.bake, "bake", 2*time.Second, "bake time of each wave")
	fs.IntVar(&o.revoke, "revoke", 1000, "agents revoked at once in the revocation storm (at most half the fleet)")
	fs.BoolVar(&o.ops, "ops", true, "run the whole-fleet operations")
	fs.BoolVar(&o.bare, "bare", true, "measure a bare opamp-go server too")
	fs.IntVar(&o.pgTop, "pg-top", 5, "statements of pg_stat_statements to report (by total time)")
	fs.StringVar(&o.myriarchd, "myriarchd", "", "the myriarchd binary; default: next to this program, else in PATH")
	fs.StringVar(&o.dir, "dir", "", "directory for configurations and logs; default: a temporary one, removed at the end")
	fs.BoolVar(&o.jsonOut, "json", false, "print one JSON object per size")
	fs.DurationVar(&o.connectMax, "connect-timeout", 0, "give up connecting after this long; default: 3× the start time at --rate, at least 2m")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return cli.ExitUsage
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "scale: "+format+"\n", a...)
		return cli.ExitUsage
	}
	for f := range strings.SplitSeq(*counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return bad("--agents %q: want positive whole numbers separated by commas", *counts)
		}
		o.counts = append(o.counts, n)
	}
	o.waves = strings.Split(*waves, ",")
	switch {
	case o.replicas < 1 || o.replicas > 32:
		return bad("--replicas %d: must be within [1, 32]", o.replicas)
	case o.perProc < 1 || o.perProc > 9000:
		return bad("--per-process %d: must be within [1, 9000] (HAProxy holds two descriptors per agent, 20,000 per process)", o.perProc)
	case o.rate < 1:
		return bad("--rate %d: must be at least 1", o.rate)
	case o.ops && o.replicas < 2:
		return bad("--replicas %d: the operations (replica and leader kill) need at least 2; or --ops=false", o.replicas)
	}
	if o.myriarchd == "" {
		p, err := findMyriarchd()
		if err != nil {
			fmt.Fprintln(stderr, "scale:", err)
			return 1
		}
		o.myriarchd = p
	}
	if _, err := haproxyBinary(); err != nil {
		fmt.Fprintln(stderr, "scale:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := scale(ctx, o, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "scale:", err)
		return 1
	}
	return 0
}

func scale(ctx context.Context, o scaleOptions, stdout, stderr io.Writer) error {
	if o.dir == "" {
		d, err := os.MkdirTemp("", "myriarch-scale-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		o.dir = d
	} else if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return err
	}
	maxPG := o.replicas*(o.maxConns+8) + 40
	pg, err := pgtest.Start(ctx, pgtest.Options{Settings: map[string]string{"max_connections": strconv.Itoa(maxPG),
		"shared_preload_libraries": "pg_stat_statements", "shared_buffers": "256MB"}})
	if err != nil {
		return err
	}
	defer pg.Close()
	progress(stderr, "PostgreSQL on port %d (max_connections %d); logs in %s", pg.Port, maxPG, o.dir)
	failed := 0
	for _, n := range o.counts {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r, err := scaleOne(ctx, o, pg, n, stderr)
		if err != nil {
			r.Errors = append(r.Errors, err.Error())
			progress(stderr, "%d agents: %v", n, err)
			failed++
		}
		printResult(stdout, o.jsonOut, r)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d sizes failed (see errors)", failed, len(o.counts))
	}
	return nil
}

func progress(w io.Writer, format string, a ...any) {
	fmt.Fprintf(w, "%s scale: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, a...))
}

func printResult(w io.Writer, asJSON bool, r scaleResult) {
	if asJSON {
		b, _ := json.Marshal(r)
		fmt.Fprintln(w, string(b))
		return
	}
	fmt.Fprintf(w, "agents %d (online %d, %d plain HTTP) on %d replicas, %d load processes; load average %v\n",
		r.Agents, r.Online, r.HTTPAgents, r.Replicas, r.LoadProcesses, r.LoadAvg)
	fmt.Fprintf(w, "  memory: %.1f KB per agent (bare opamp-go %.1f at %d agents); replica CPU %.1f %% of a core (%.2f per 1k agents; bare %.2f)\n",
		r.KBPerAgent, r.BareKBPerAgent, r.BareAgents, r.ReplicaCPUPct, r.ReplicaCPUPctPer1k, r.BareCPUPctPer1k)
	fmt.Fprintf(w, "  PostgreSQL: %.1f %% CPU, %d connections, %.0f row writes/s, %.0f commits/s; event bus %.1f notifications/s; all connected in %.1f s\n",
		r.PGCPUPct, r.PGConnections, r.WritesPerS, r.CommitsPerS, r.NotificationsPerS, r.ConnectAllS)
	fmt.Fprintf(w, "  rollout: plan %.2f s, %d-agent wave applied in %.1f s, gate latency %.1f s\n", r.RolloutPlanS, r.WaveAgents, r.WaveApplyS, r.GateLatencyS)
	fmt.Fprintf(w, "  replica kill (%d agents): all online in %.1f s, lost %d, double-counted %d (API lists %d online)\n",
		r.KilledReplicaAgents, r.ReplicaKillAllOnlineS, r.Lost, r.DoubleCounted, r.APIOnline)
	fmt.Fprintf(w, "  leader kill mid-rollout: new leader %.1f s, rollout done %.1f s after; revision once %d, twice %d, missing %d\n",
		r.LeaderFailoverS, r.LeaderKillRolloutS, r.RevisionOnce, r.RevisionDuplicates, r.RevisionMissing)
	fmt.Fprintf(w, "  revocation storm: %d revoked, WebSocket ones off in %.1f s, all in %.1f s (%d still online)\n",
		r.Revoked, r.RevokeAllOfflineS, r.RevokeHTTPOfflineS, r.RevokeStillOnline)
	for _, e := range r.Errors {
		fmt.Fprintf(w, "  error: %s\n", e)
	}
}

func loadAvg() []float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return nil
	}
	var out []float64
	for _, f := range strings.Fields(string(b))[:3] {
		v, _ := strconv.ParseFloat(f, 64)
		out = append(out, v)
	}
	return out
}

// fleet is one size's running set-up.
type fleet struct {
	o       scaleOptions
	n       int
	dsn     string
	pool    *pgxpool.Pool
	st      *store.Store
	reps    []*replicaProc
	extra   map[string]string
	secret  string
	loads   []*loadProc
	haps    []*proc
	logw    io.Writer
	wsCount int
	stderr  io.Writer
}

func scaleOne(parent context.Context, o scaleOptions, pg *pgtest.Cluster, n int, stderr io.Writer) (r scaleResult, err error) {
	r = scaleResult{Agents: n, Replicas: o.replicas}
	defer func() { r.LoadAvg = loadAvg() }()
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	self, err := os.Executable()
	if err != nil {
		return r, err
	}
	dir := filepath.Join(o.dir, fmt.Sprintf("n%d", n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return r, err
	}
	logf, err := os.Create(filepath.Join(dir, "processes.log"))
	if err != nil {
		return r, err
	}
	defer logf.Close()
	logw := &lockedWriter{w: logf}

	db := fmt.Sprintf("scale_%d_%d", n, time.Now().UnixNano())
	if _, err := pg.Psql(ctx, "CREATE DATABASE "+db); err != nil {
		return r, fmt.Errorf("creating database %s: %w", db, err)
	}
	f := &fleet{o: o, n: n, dsn: pg.DSN(db), logw: logw, stderr: stderr, secret: "scale-enrollment-secret-0123456789",
		extra: map[string]string{"database.maxConns": strconv.Itoa(o.maxConns), "jobs.rolloutInterval": o.interval.String(),
			"agents.reconnectsPerMinute": "1000"}}
	if f.pool, err = pgxpool.New(ctx, f.dsn); err != nil {
		return r, err
	}
	defer f.pool.Close()
	f.st = &store.Store{Pool: f.pool}
	_, _ = f.pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
	defer f.teardown()

	for i := range o.replicas {
		rep, err := startReplicaProc(ctx, o.myriarchd, fmt.Sprintf("r%d", i+1), f.dsn, f.secret, f.extra, logw)
		if err != nil {
			return r, err
		}
		f.reps = append(f.reps, rep)
	}
	if err := f.waitReady(2*time.Minute, true); err != nil {
		return r, err
	}
	base := make([]procSample, len(f.reps))
	for i, rep := range f.reps {
		base[i], _ = readProc(rep.pid())
	}

	// The yardstick first, on an otherwise idle fleet.
	if o.bare {
		if err := f.measureBare(ctx, self, &r); err != nil {
			return r, fmt.Errorf("bare opamp-go server: %w", err)
		}
	}

	// HAProxy instances and load processes.
	procs := (n + o.perProc - 1) / o.perProc
	r.LoadProcesses = procs
	start := time.Now()
	for i := range procs {
		share := n / procs
		if i < n%procs {
			share++
		}
		hp, listen, err := startHAProxy(ctx, dir, fmt.Sprintf("haproxy-%d", i), share+500, f.reps, logw)
		if err != nil {
			return r, err
		}
		f.haps = append(f.haps, hp)
		lp, err := startLoadProc(self, loadOptions{url: listen, secret: f.secret, agents: share, httpEvery: o.httpEvery,
			rate: max(1, o.rate/procs), heartbeat: o.heartbeat, poll: o.poll, attrs: map[string]string{"role": "scale"},
			startIndex: i * o.perProc}, logw)
		if err != nil {
			return r, err
		}
		f.loads = append(f.loads, lp)
	}
	for i := range n {
		if o.httpEvery > 0 && (i%o.perProc)%o.httpEvery == o.httpEvery-1 {
			r.HTTPAgents++
		}
	}
	f.wsCount = n - r.HTTPAgents
	limit := o.connectMax
	if limit == 0 {
		limit = max(2*time.Minute, 3*time.Duration(n/o.rate)*time.Second)
	}
	if err := f.waitOnline(ctx, "connect", int64(n), limit, func(online int64, st agentStatus) bool {
		return online == int64(n) && st.Connected == n
	}); err != nil {
		return r, err
	}
	r.ConnectAllS = time.Since(start).Seconds()
	progress(stderr, "%d agents: all connected and online in %.1f s", n, r.ConnectAllS)

	// Steady state.
	sleepCtx(ctx, o.settle)
	_, _ = f.pool.Exec(ctx, "SELECT pg_stat_statements_reset()")
	s0, err := f.sample(ctx, pg)
	if err != nil {
		return r, err
	}
	sleepCtx(ctx, o.steady)
	s1, err := f.sample(ctx, pg)
	if err != nil {
		return r, err
	}
	dt := s1.at.Sub(s0.at).Seconds()
	var cpuSum, kbSum float64
	var kbN int
	for i := range f.reps {
		cpu := cpuPct(s0.reps[i], s1.reps[i])
		cpuSum += cpu
		agents := s1.repAgents[i]
		r.ReplicaAgents = append(r.ReplicaAgents, agents)
		r.ReplicaRSSMB = append(r.ReplicaRSSMB, round(s1.reps[i].rss/1e6, 1))
		kb := 0.0
		if agents > 0 {
			kb = (s1.reps[i].rss - base[i].rss) / 1e3 / float64(agents)
			kbSum += kb
			kbN++
		}
		r.ReplicaKBPerAgent = append(r.ReplicaKBPerAgent, round(kb, 1))
	}
	r.ReplicaCPUPct = round(cpuSum/float64(len(f.reps)), 2)
	r.ReplicaCPUPctPer1k = round(cpuSum/float64(n)*1000, 3)
	if kbN > 0 {
		r.KBPerAgent = round(kbSum/float64(kbN), 1)
	}
	r.PGCPUPct = round(cpuPct(s0.pg, s1.pg), 2)
	r.PGConnections = s1.pgConns
	r.WritesPerS = round((s1.writes-s0.writes)/dt, 1)
	r.CommitsPerS = round((s1.commits-s0.commits)/dt, 1)
	r.NotificationsPerS = round((s1.notifications-s0.notifications)/dt, 2)
	r.Online = s1.online
	r.PGTop = f.pgTop(ctx)
	progress(stderr, "%d agents: steady: %.1f KB/agent, replica CPU %.1f %%, PostgreSQL CPU %.1f %%, %.0f writes/s", n, r.KBPerAgent, r.ReplicaCPUPct, r.PGCPUPct, r.WritesPerS)

	if o.ops {
		f.operations(ctx, pg, &r)
	}
	return r, nil
}

// lockedWriter serializes the processes' log lines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func round(v float64, digits int) float64 {
	p := math.Pow10(digits)
	return math.Round(v*p) / p
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// teardown stops the load processes, HAProxy and the replicas.
func (f *fleet) teardown() {
	var wg sync.WaitGroup
	for _, l := range f.loads {
		wg.Go(l.close)
	}
	wg.Wait()
	for _, h := range f.haps {
		h.signalWait(syscall.SIGTERM, 5*time.Second)
	}
	for _, rep := range f.reps {
		wg.Go(rep.stop)
	}
	wg.Wait()
}

// waitReady waits until every live replica answers /readyz and, with
// leader, one of them leads.
func (f *fleet) waitReady(timeout time.Duration, leader bool) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		ok, leads := true, !leader
		for _, r := range f.reps {
			if r.exited() {
				return fmt.Errorf("replica %s exited: %v (see its log)", r.id, r.err)
			}
			ok = ok && r.ready()
			leads = leads || r.leads()
		}
		if ok && leads {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("the replicas were not ready (and leading) within %s", timeout)
}

// leader is the replica that leads now (nil if none says so).
func (f *fleet) leader() *replicaProc {
	for _, r := range f.reps {
		if !r.exited() && r.leads() {
			return r
		}
	}
	return nil
}

// agentsStatus sums the load processes' answers.
func (f *fleet) agentsStatus() (agentStatus, error) {
	sum := agentStatus{Revs: map[string][2]int{}}
	for _, l := range f.loads {
		st, err := l.status()
		if err != nil {
			return sum, err
		}
		sum.Agents += st.Agents
		sum.WS += st.WS
		sum.Connected += st.Connected
		sum.Connects += st.Connects
		sum.Failures += st.Failures
		for k, v := range st.Revs {
			s := sum.Revs[k]
			sum.Revs[k] = [2]int{s[0] + v[0], s[1] + v[1]}
		}
	}
	return sum, nil
}

// waitOnline polls the database and the load processes until done holds,
// printing progress every 5 s.
func (f *fleet) waitOnline(ctx context.Context, what string, want int64, timeout time.Duration, done func(online int64, st agentStatus) bool) error {
	start := time.Now()
	last := start
	for {
		online, err := store.CountOnline(ctx, f.pool, nil)
		if err != nil {
			return err
		}
		st, err := f.agentsStatus()
		if err != nil {
			return err
		}
		if done(online, st) {
			return nil
		}
		for _, r := range f.reps {
			if r.exited() {
				return fmt.Errorf("%s: replica %s exited: %v (see its log)", what, r.id, r.err)
			}
		}
		if time.Since(last) >= 5*time.Second {
			last = time.Now()
			progress(f.stderr, "%d agents: %s: %d of %d online in the database, %d agents connected at least once, %.0f s",
				f.n, what, online, want, st.Connected, time.Since(start).Seconds())
		}
		if time.Since(start) > timeout || ctx.Err() != nil {
			return fmt.Errorf("%s: %d of %d online after %s (%d connected at the agents)", what, online, want, timeout, st.Connected)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

type fleetSample struct {
	at              time.Time
	reps            []procSample
	repAgents       []int64
	pg              procSample
	writes, commits float64
	notifications   float64
	pgConns         int64
	online          int64
}

func (f *fleet) sample(ctx context.Context, pg *pgtest.Cluster) (fleetSample, error) {
	s := fleetSample{at: time.Now()}
	byReplica, err := store.OnlineByReplica(ctx, f.pool)
	if err != nil {
		return s, err
	}
	for _, r := range f.reps {
		ps, _ := readProc(r.pid())
		s.reps = append(s.reps, ps)
		s.repAgents = append(s.repAgents, byReplica[r.id])
		s.notifications += metricValue(r.metrics(), "myriarch_eventbus_notifications_total")
	}
	if s.pg, err = readPostgres(filepath.Join(pg.Dir(), "data")); err != nil {
		return s, err
	}
	err = f.pool.QueryRow(ctx, `SELECT (tup_inserted + tup_updated + tup_deleted)::float8, xact_commit::float8,
		(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')
		FROM pg_stat_database WHERE datname = current_database()`).Scan(&s.writes, &s.commits, &s.pgConns)
	if err != nil {
		return s, err
	}
	s.online, err = store.CountOnline(ctx, f.pool, nil)
	return s, err
}

// pgTop reads the statements that took the most time since the reset.
func (f *fleet) pgTop(ctx context.Context) []pgStmt {
	if f.o.pgTop <= 0 {
		return nil
	}
	return pgTopOf(ctx, f.pool, f.o.pgTop)
}

// measureBare runs a bare opamp-go server with as many agents as one
// replica holds (one load process, no HAProxy) and measures its memory and
// CPU per agent over the same windows.
func (f *fleet) measureBare(ctx context.Context, self string, r *scaleResult) error {
	m := min((f.n+f.o.replicas-1)/f.o.replicas, 18000)
	r.BareAgents = m
	cmd := newSelfCmd(self, "bare-server")
	cmd.Stderr = f.logw
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	p, err := startProc(cmd)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close(); p.signalWait(syscall.SIGTERM, 30*time.Second) }()
	var ev struct{ Addr string }
	if err := json.NewDecoder(out).Decode(&ev); err != nil || ev.Addr == "" {
		return fmt.Errorf("no listening address: %v", err)
	}
	base, err := readProc(p.pid())
	if err != nil {
		return err
	}
	lp, err := startLoadProc(self, loadOptions{url: ev.Addr, secret: "bare", agents: m, httpEvery: f.o.httpEvery, rate: f.o.rate,
		heartbeat: f.o.heartbeat, poll: f.o.poll, attrs: map[string]string{"role": "bare"}}, f.logw)
	if err != nil {
		return err
	}
	defer lp.close()
	deadline := time.Now().Add(max(2*time.Minute, 3*time.Duration(m/f.o.rate)*time.Second))
	for {
		st, err := lp.status()
		if err != nil {
			return err
		}
		if st.Connected == m {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%d of %d agents connected", st.Connected, m)
		}
		time.Sleep(250 * time.Millisecond)
	}
	sleepCtx(ctx, f.o.settle)
	s0, _ := readProc(p.pid())
	sleepCtx(ctx, f.o.steady)
	s1, err := readProc(p.pid())
	if err != nil {
		return err
	}
	r.BareKBPerAgent = round((s1.rss-base.rss)/1e3/float64(m), 1)
	r.BareCPUPctPer1k = round(cpuPct(s0, s1)/float64(m)*1000, 3)
	progress(f.stderr, "%d agents: bare opamp-go server with %d agents: %.1f KB/agent", f.n, m, r.BareKBPerAgent)
	return nil
}

// apiOnline lists the online agents through the REST API of replica rep,
// page by page, and returns how many there are and how many uids appear
// more than once.
func (f *fleet) apiOnline(ctx context.Context, rep *replicaProc, token string) (online, dup int64, err error) {
	seen := map[string]bool{}
	after := ""
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+rep.httpAddr+"/api/v1/agents?status=online&limit=1000&after="+after, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return online, dup, err
		}
		var page struct {
			Agents []struct {
				UID string `json:"instance_uid"`
			} `json:"agents"`
			Next string `json:"next"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return online, dup, fmt.Errorf("GET /api/v1/agents: %d %v", resp.StatusCode, err)
		}
		for _, a := range page.Agents {
			if seen[a.UID] {
				dup++
			}
			seen[a.UID] = true
			online++
		}
		if page.Next == "" {
			return online, dup, nil
		}
		after = page.Next
	}
}

// liveWS sums the open WebSocket connections of the live replicas.
func (f *fleet) liveWS() int64 {
	var n float64
	for _, r := range f.reps {
		if !r.exited() {
			n += metricValue(r.metrics(), "myriarch_opamp_connections")
		}
	}
	return int64(n)
}

// restart starts replica i again on its addresses (its place in HAProxy).
func (f *fleet) restart(ctx context.Context, i int) error {
	old := f.reps[i]
	rep, err := startReplicaAt(ctx, f.o.myriarchd, old.id, f.dsn, f.secret, old.httpAddr, old.opampAddr, f.extra, f.logw)
	if err != nil {
		return err
	}
	f.reps[i] = rep
	return f.waitReady(time.Minute, true)
}

// operations runs the whole-fleet operations in order: a rollout, a
// replica killed, the leader killed during a rollout, a revocation storm.
// A failed operation is recorded and the next one still runs.
func (f *fleet) operations(ctx context.Context, pg *pgtest.Cluster, r *scaleResult) {
	fail := func(what string, err error) {
		r.Errors = append(r.Errors, what+": "+err.Error())
		progress(f.stderr, "%d agents: %s: %v", f.n, what, err)
	}
	if err := f.opRollout(ctx, pg, r); err != nil {
		fail("rollout", err)
	}
	if err := f.opReplicaKill(ctx, r); err != nil {
		fail("replica kill", err)
	}
	if err := f.opLeaderKill(ctx, r); err != nil {
		fail("leader kill", err)
	}
	if err := f.opRevoke(ctx, r); err != nil {
		fail("revocation storm", err)
	}
	r.FinalOnline, _ = store.CountOnline(ctx, f.pool, nil)
}

// httpConnID is the connection id myriarchd records for plain-HTTP
// agents (opampserver.HTTPConnID; the load tool does not link the server).
const httpConnID = "http"

func revisionBody(rev int) string {
	return fmt.Sprintf("receivers: {otlp: {}}\nexporters: {debug: {}}\n%s%d\n", revMarker, rev)
}

func (f *fleet) rolloutSpec() rollout.Spec {
	return rollout.Spec{Waves: f.o.waves, MaxInProgress: f.o.maxIn, BakeS: rollout.Secs(f.o.bake.Seconds())}
}

func (f *fleet) opRollout(ctx context.Context, pg *pgtest.Cluster, r *scaleResult) error {
	s0, err := f.sample(ctx, pg)
	if err != nil {
		return err
	}
	id, err := startBenchRollout(ctx, f.st, "scale", map[string]string{"role": "scale"}, revisionBody(1), f.rolloutSpec())
	if err != nil {
		return err
	}
	d, err := waitRollout(ctx, f.st, id, 10*time.Minute+time.Duration(f.n/50)*time.Second)
	if err != nil {
		return err
	}
	s1, err := f.sample(ctx, pg)
	if err != nil {
		return err
	}
	evs := rolloutEvents(d, f.n, f.o.bake, f.o.interval)
	for _, ev := range evs {
		b, _ := json.Marshal(ev)
		progress(f.stderr, "%d agents: rollout: %s", f.n, b)
	}
	r.RolloutPlanS = round(evs[0]["plan_s"].(float64), 3)
	for _, ev := range evs[1:] {
		if a := ev["agents"].(int); a >= r.WaveAgents {
			r.WaveAgents, r.WaveApplyS = a, round(ev["apply_s"].(float64), 2)
		}
		r.GateLatencyS = max(r.GateLatencyS, round(ev["gate_s"].(float64)-f.o.bake.Seconds(), 2))
	}
	dt := s1.at.Sub(s0.at).Seconds()
	r.RolloutNotifPerS = round((s1.notifications-s0.notifications)/dt, 1)
	r.RolloutPGCPUPct = round(cpuPct(s0.pg, s1.pg), 1)
	// The plain-HTTP agents take the revision at their next poll.
	deadline := time.Now().Add(f.o.poll*3 + 30*time.Second)
	var st agentStatus
	for {
		st, err = f.agentsStatus()
		if err != nil {
			return err
		}
		r.RolloutRevOnce = st.Revs["1"][0]
		if st.Revs["1"][0]+st.Revs["1"][1] >= f.n || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if r.RolloutRevOnce < f.n {
		// What the rollout recorded for its agents, next to what they
		// received: which side is wrong.
		progress(f.stderr, "%d agents: rollout %d: %d agents got revision 1 once, %d more than once; the rollout recorded %+v",
			f.n, id, r.RolloutRevOnce, st.Revs["1"][1], d.Counts)
	}
	return nil
}

func (f *fleet) opReplicaKill(ctx context.Context, r *scaleResult) error {
	lead := f.leader()
	vi := slices.IndexFunc(f.reps, func(x *replicaProc) bool { return x != lead && !x.exited() })
	if vi < 0 {
		return errors.New("no follower to kill")
	}
	victim := f.reps[vi]
	onV, _, _, err := store.OnlineOn(ctx, f.pool, victim.id)
	if err != nil {
		return err
	}
	r.KilledReplicaAgents = onV
	want := int64(f.n)
	progress(f.stderr, "%d agents: kill -9 of follower %s holding %d agents", f.n, victim.id, onV)
	t0 := time.Now()
	victim.kill()
	defer func() {
		if err := f.restart(ctx, vi); err != nil {
			r.Errors = append(r.Errors, "restarting the killed replica: "+err.Error())
		}
	}()
	var online int64
	for {
		// WebSocket agents move with their connection; a plain-HTTP agent
		// is recorded on the replica that answered its first poll there
		// (counted apart: stale_http_on_killed).
		var on, onHTTP int64
		on, onHTTP, online, err = store.OnlineOnByConn(ctx, f.pool, victim.id, httpConnID)
		if err != nil {
			return err
		}
		r.StaleHTTPOnKilled = onHTTP
		if on == 0 && online == want {
			r.ReplicaKillAllOnlineS = round(time.Since(t0).Seconds(), 2)
			break
		}
		if time.Since(t0) > 5*time.Minute || ctx.Err() != nil {
			r.Lost = want - online
			return fmt.Errorf("after 5 m, %d online, %d still recorded on the killed replica", online, on)
		}
		time.Sleep(100 * time.Millisecond)
	}
	progress(f.stderr, "%d agents: all online again %.1f s after the kill", f.n, r.ReplicaKillAllOnlineS)
	// Settled: every agent online once in the database, once in the API,
	// and the survivors hold no more WebSocket connections than there are
	// WebSocket agents.
	sleepCtx(ctx, 3*time.Second)
	online, _ = store.CountOnline(ctx, f.pool, nil)
	r.Lost = max(0, want-online)
	r.DoubleCounted = max(0, online-want) + max(0, f.liveWS()-int64(f.wsCount))
	tok, err := f.st.CreateToken(ctx, fmt.Sprintf("scale-%d", time.Now().UnixNano()))
	if err != nil {
		return err
	}
	apiN, dup, err := f.apiOnline(ctx, f.leader(), tok)
	if err != nil {
		return err
	}
	r.APIOnline = apiN
	r.DoubleCounted += dup + max(0, apiN-want)
	r.Lost = max(r.Lost, want-apiN)
	return nil
}

func (f *fleet) opLeaderKill(ctx context.Context, r *scaleResult) error {
	id, err := startBenchRollout(ctx, f.st, "scale", map[string]string{"role": "scale"}, revisionBody(2), f.rolloutSpec())
	if err != nil {
		return err
	}
	// Kill the leader once the second wave has started: mid-rollout.
	if !waitFor(ctx, 5*time.Minute, func() bool {
		d, err := (rollout.Service{Store: f.st}).Detail(ctx, id, 1)
		return err == nil && len(d.WaveProgress) > 1 && d.WaveProgress[1].StartedAt != nil
	}) {
		return errors.New("the rollout's second wave did not start within 5 m")
	}
	lead := f.leader()
	if lead == nil {
		return errors.New("no leader")
	}
	li := slices.Index(f.reps, lead)
	progress(f.stderr, "%d agents: kill -9 of the leader %s during the rollout", f.n, lead.id)
	t0 := time.Now()
	lead.kill()
	defer func() {
		if err := f.restart(ctx, li); err != nil {
			r.Errors = append(r.Errors, "restarting the killed leader: "+err.Error())
		}
	}()
	if !waitFor(ctx, 2*time.Minute, func() bool { return f.leader() != nil }) {
		return errors.New("no new leader within 2 m")
	}
	r.LeaderFailoverS = round(time.Since(t0).Seconds(), 2)
	if _, err := waitRollout(ctx, f.st, id, 10*time.Minute+time.Duration(f.n/50)*time.Second); err != nil {
		return err
	}
	r.LeaderKillRolloutS = round(time.Since(t0).Seconds(), 2)
	progress(f.stderr, "%d agents: new leader %.1f s, rollout done %.1f s after the leader kill", f.n, r.LeaderFailoverS, r.LeaderKillRolloutS)
	// Count at the agents, once the plain-HTTP ones polled again.
	deadline := time.Now().Add(f.o.poll*3 + 30*time.Second)
	var st agentStatus
	for {
		if st, err = f.agentsStatus(); err != nil {
			return err
		}
		if got := st.Revs["2"]; got[0]+got[1] >= f.n || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	got := st.Revs["2"]
	r.RevisionOnce, r.RevisionDuplicates, r.RevisionMissing = got[0], got[1], f.n-got[0]-got[1]
	return nil
}

func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

func (f *fleet) opRevoke(ctx context.Context, r *scaleResult) error {
	k := min(f.o.revoke, f.n/2)
	if k < 1 {
		return nil
	}
	uids, err := store.SampleOnline(ctx, f.pool, k)
	if err != nil {
		return err
	}
	r.Revoked = len(uids)
	progress(f.stderr, "%d agents: revoking %d agents at once", f.n, len(uids))
	t0 := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	work := make(chan string)
	for range 16 {
		wg.Go(func() {
			for u := range work {
				if _, err := f.st.RevokeAgent(ctx, u, "scale"); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for _, u := range uids {
		work <- u
	}
	close(work)
	wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("%d revocations failed, the first: %w", len(errs), errs[0])
	}
	var still, stillHTTP int64
	for {
		// A WebSocket agent is disconnected at once; a plain-HTTP one is
		// refused at its next poll (recorded offline apart).
		if still, stillHTTP, err = store.OnlineAmongByConn(ctx, f.pool, uids, httpConnID); err != nil {
			return err
		}
		if still == 0 && r.RevokeAllOfflineS == 0 {
			r.RevokeAllOfflineS = round(time.Since(t0).Seconds(), 2)
		}
		if still+stillHTTP == 0 {
			r.RevokeHTTPOfflineS = round(time.Since(t0).Seconds(), 2)
			break
		}
		if time.Since(t0) > 3*time.Minute || ctx.Err() != nil {
			r.RevokeStillOnline = still + stillHTTP
			return fmt.Errorf("%d of %d revoked agents still online after 3 m (%d plain HTTP)", still+stillHTTP, len(uids), stillHTTP)
		}
		time.Sleep(100 * time.Millisecond)
	}
	progress(f.stderr, "%d agents: the %d revoked agents offline %.1f s (WebSocket) and %.1f s (all) after the storm began",
		f.n, len(uids), r.RevokeAllOfflineS, r.RevokeHTTPOfflineS)
	return nil
}
