package main

// The telemetry command (issue 27's numbers): one replica on a private
// PostgreSQL, N simulated agents that report their own metrics, measured
// with telemetry off (connected, not sending) and then on (each agent
// POSTs a collector's own metrics every interval), in one run; then the
// UI pages with charts, timed at N agents.

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/open-telemetry/opamp-go/protobufs"

	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/fleet/telemetry"
	"github.com/myriarch/myriarch/internal/pgtest"
)

func init() {
	commands.Register(cli.Command{Name: "telemetry",
		Summary: "agents' own metrics at N agents: replica CPU and RSS without and with, PostgreSQL writes and bytes per agent per day, chart pages' time",
		Run:     runTelemetryBench})
}

const telemetryBenchUsage = `Usage: myriarch-loadagents telemetry [--agents 10000] [--interval 10s] [--duration 3m] [--baseline 1m] [--json] [flags]
Starts a private PostgreSQL 15 (with pg_stat_statements; or --dsn names an
empty database), one replica as a child process (myriarchd serve, the real
binary: --myriarchd) and N simulated agents in this process (opamp-go
WebSocket clients that report their own metrics and take their credential
and the own_metrics offer). It measures the replica (CPU from /proc, RSS)
and PostgreSQL over --baseline with the agents connected and not sending,
then over --duration with every agent POSTing a collector's own metrics
(OTLP/HTTP protobuf, pdata; several receivers and exporters × signals, and
what a collector sends besides) every --interval, staggered; then times the
UI pages with charts. Progress goes to stderr, the result to stdout (one
JSON object with --json).`

type telemetryOptions struct {
	agents     int
	interval   time.Duration
	duration   time.Duration
	baseline   time.Duration
	settle     time.Duration
	rate       int
	heartbeat  time.Duration
	conns      int
	uiRequests int
	seed       int
	gzip       bool
	dsn        string
	myriarchd  string
	dir        string
	jsonOut    bool
	extra      map[string]string
}

// phase is what was measured over one window.
type phase struct {
	Seconds float64 `json:"s"`
	// ReplicaCPUPct is the replica's CPU in percent of one core (/proc).
	ReplicaCPUPct float64 `json:"replica_cpu_pct"`
	ReplicaRSSMB  float64 `json:"replica_rss_mb"`
	// PGCPUPct is PostgreSQL's (postmaster and children; a floor: a
	// backend that ended takes its CPU with it). 0 with --dsn.
	PGCPUPct        float64   `json:"pg_cpu_pct"`
	DBRowWritesPerS float64   `json:"db_row_writes_per_s"`
	DBCommitsPerS   float64   `json:"db_commits_per_s"`
	WALBytesPerS    float64   `json:"wal_bytes_per_s"`
	LoadAvg         []float64 `json:"load_avg"`
}

type pageTime struct {
	Page     string `json:"page"`
	Path     string `json:"path"`
	Requests int    `json:"requests"`
	// Server* are the replica's own time (the UI's Server-Timing
	// trailer; 0 for the API, which sends none), the others the wall
	// time at this process.
	ServerMedianMS float64 `json:"server_median_ms"`
	ServerP99MS    float64 `json:"server_p99_ms"`
	MedianMS       float64 `json:"median_ms"`
	P99MS          float64 `json:"p99_ms"`
	Bytes          int     `json:"bytes"`
	SVGs           int     `json:"svgs"`
}

// telemetryResult is the command's output.
type telemetryResult struct {
	Agents           int     `json:"agents"`
	Online           int64   `json:"online"`
	Offered          int     `json:"offered"`
	IntervalS        float64 `json:"interval_s"`
	SeriesPerAgent   int     `json:"series_per_agent"`
	MetricsPerBody   int     `json:"metrics_per_body"`
	BodyBytes        int     `json:"body_bytes"`
	Gzip             bool    `json:"gzip"`
	ClientConns      int     `json:"client_conns"`
	ConnectAllS      float64 `json:"connect_all_s"`
	Off              phase   `json:"off"`
	On               phase   `json:"on"`
	CPURatio         float64 `json:"cpu_ratio"`
	RSSRatio         float64 `json:"rss_ratio"`
	Requests         int64   `json:"requests"`
	RequestErrors    int64   `json:"request_errors"`
	RequestsPerS     float64 `json:"requests_per_s"`
	RequestP50MS     float64 `json:"request_p50_ms"`
	RequestP99MS     float64 `json:"request_p99_ms"`
	SamplesPerS      float64 `json:"samples_per_s"`
	RowsWritten      int64   `json:"rows_written"`
	RowsWrittenPerS  float64 `json:"rows_written_per_s"`
	TableInsertsPerS float64 `json:"table_inserts_per_s"`
	TableUpdatesPerS float64 `json:"table_updates_per_s"`
	// TableBytes* are the size of the telemetry table (heap, TOAST,
	// both indexes: telemetry.ReadTableCounters) at the start and end of the on window.
	TableBytesStart int64 `json:"table_bytes_start"`
	TableBytesEnd   int64 `json:"table_bytes_end"`
	// TableGrowthBytesPerAgentPerDay is the measured growth extrapolated
	// to a day (both tiers, dead row versions not yet vacuumed included).
	TableGrowthBytesPerAgentPerDay float64            `json:"table_growth_bytes_per_agent_per_day"`
	LiveRows                       map[string]int64   `json:"live_rows"`
	RowBytes                       map[string]float64 `json:"row_bytes"`
	// DiskBytesPerRow is pg_total_relation_size over the live rows at the
	// end: each row's share of heap, indexes and dead versions.
	DiskBytesPerRow float64 `json:"disk_bytes_per_row"`
	// CoarseBytesPerAgentPerDay is what the coarse tier adds per agent per
	// day (rows per day × DiskBytesPerRow, extrapolated), kept for
	// telemetry.coarseRetention; CoarseBytesPerAgentRetained is that
	// tier at its retention, FineBytesPerAgentRetained the fine tier's.
	CoarseBytesPerAgentPerDay   float64    `json:"coarse_bytes_per_agent_per_day"`
	CoarseBytesPerAgentRetained float64    `json:"coarse_bytes_per_agent_retained"`
	FineBytesPerAgentRetained   float64    `json:"fine_bytes_per_agent_retained"`
	UI                          []pageTime `json:"ui"`
	UITiming                    string     `json:"ui_timing"`
	LoadAvg                     []float64  `json:"load_avg"`
	PGTop                       []pgStmt   `json:"pg_top,omitempty"`
	Errors                      []string   `json:"errors,omitempty"`
}

func runTelemetryBench(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("telemetry", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, telemetryBenchUsage); fs.PrintDefaults() }
	var o telemetryOptions
	fs.IntVar(&o.agents, "agents", 10000, "simulated agents")
	fs.DurationVar(&o.interval, "interval", 10*time.Second, "each agent's own-metrics interval")
	fs.DurationVar(&o.duration, "duration", 3*time.Minute, "measurement window with telemetry on")
	fs.DurationVar(&o.baseline, "baseline", time.Minute, "measurement window with telemetry off (agents connected, not sending)")
	fs.DurationVar(&o.settle, "settle", 15*time.Second, "wait after every agent is online, and after the sending started, before each window")
	fs.IntVar(&o.rate, "rate", 500, "agents started per second")
	fs.DurationVar(&o.heartbeat, "heartbeat", 30*time.Second, "OpAMP heartbeat of the agents")
	fs.IntVar(&o.conns, "conns", 256, "keep-alive connections the agents' OTLP requests share (one process holds 20,000 descriptors)")
	fs.IntVar(&o.uiRequests, "ui-requests", 40, "requests per UI page timed")
	fs.IntVar(&o.seed, "seed-agents", 50, "agents (the first page of the agents list) whose 30 minutes of history are written before the UI is timed")
	fs.BoolVar(&o.gzip, "gzip", false, "gzip the OTLP bodies")
	fs.StringVar(&o.dsn, "dsn", "", "PostgreSQL of an empty database; default: a private one")
	fs.StringVar(&o.myriarchd, "myriarchd", "", "the myriarchd binary; default: next to this program, else in PATH")
	fs.StringVar(&o.dir, "dir", "", "directory for the replica's log; default: a temporary one, removed at the end")
	fs.BoolVar(&o.jsonOut, "json", false, "print one JSON object")
	set := attrFlags{}
	fs.Var(set, "set", "a setting of the replica, key=value (repeatable; e.g. telemetry.flushInterval=1s)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return cli.ExitUsage
	}
	o.extra = set
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "telemetry: "+format+"\n", a...)
		return cli.ExitUsage
	}
	switch {
	case o.agents < 1 || o.agents > 15000:
		return bad("--agents %d: must be within [1, 15000] (one descriptor per agent, 20,000 per process)", o.agents)
	case o.interval < 100*time.Millisecond:
		return bad("--interval %s: must be at least 100ms", o.interval)
	case o.duration < o.interval || o.baseline <= 0:
		return bad("--duration %s, --baseline %s: the duration must be at least one interval, the baseline positive", o.duration, o.baseline)
	case o.conns < 1 || o.conns > 2000:
		return bad("--conns %d: must be within [1, 2000]", o.conns)
	case o.uiRequests < 1 || o.rate < 1:
		return bad("--ui-requests and --rate must be at least 1")
	}
	if o.myriarchd == "" {
		p, err := findMyriarchd()
		if err != nil {
			fmt.Fprintln(stderr, "telemetry:", err)
			return 1
		}
		o.myriarchd = p
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	r, err := telemetryBench(ctx, o, stderr)
	if err != nil {
		r.Errors = append(r.Errors, err.Error())
	}
	printTelemetry(stdout, o.jsonOut, r)
	if err != nil {
		fmt.Fprintln(stderr, "telemetry:", err)
		return 1
	}
	return 0
}

func tprogress(w io.Writer, format string, a ...any) {
	fmt.Fprintf(w, "%s telemetry: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, a...))
}

// pgCounters are cumulative counters of the database, read twice per window.
type pgCounters struct {
	at                   time.Time
	writes, commits      float64
	wal                  float64
	tabIns, tabUpd       float64
	tableBytes           int64
	proc                 procSample
	rep                  procSample
	rowsWritten, samples float64
}

func telemetryBench(ctx context.Context, o telemetryOptions, stderr io.Writer) (r telemetryResult, err error) {
	r = telemetryResult{Agents: o.agents, IntervalS: o.interval.Seconds(), Gzip: o.gzip, ClientConns: o.conns,
		SeriesPerAgent: catalogSeries(),
		UITiming: "server_*: the replica's own time from the UI's Server-Timing trailer (session check to last byte); the others: wall time of each GET " +
			"on loopback at the load process (request sent to body read), logged in with an admin token's UI session"}
	defer func() { r.LoadAvg = loadAvg() }()
	if o.dir == "" {
		d, err := os.MkdirTemp("", "myriarch-telemetry-")
		if err != nil {
			return r, err
		}
		defer os.RemoveAll(d)
		o.dir = d
	}
	var pgDir string
	if o.dsn == "" {
		pg, err := pgtest.Start(ctx, pgtest.Options{Settings: map[string]string{"shared_preload_libraries": "pg_stat_statements",
			"shared_buffers": "256MB", "max_connections": "100"}})
		if err != nil {
			return r, err
		}
		defer pg.Close()
		o.dsn, pgDir = pg.DSN(""), filepath.Join(pg.Dir(), "data")
	}
	pool, err := pgxpool.New(ctx, o.dsn)
	if err != nil {
		return r, err
	}
	defer pool.Close()
	_, _ = pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)

	logf, err := os.Create(filepath.Join(o.dir, "replica.log"))
	if err != nil {
		return r, err
	}
	defer logf.Close()
	const secret = "telemetry-bench-secret-0123"
	extra := map[string]string{"telemetry.enabled": "true"}
	for k, v := range o.extra {
		extra[k] = v
	}
	rep, err := startReplicaProc(ctx, o.myriarchd, "telemetry", o.dsn, secret, extra, &lockedWriter{w: logf})
	if err != nil {
		return r, err
	}
	defer rep.stop()
	if !fleettest.Eventually(time.Minute, rep.leads) {
		return r, fmt.Errorf("the replica did not start leading (log: %s)", logf.Name())
	}
	tprogress(stderr, "replica %s up (pid %d); starting %d agents at %d/s", rep.id, rep.pid(), o.agents, o.rate)

	// The agents: credential and own_metrics offer, heartbeats.
	start := time.Now()
	agents := make([]*fleettest.Agent, 0, o.agents)
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var wg sync.WaitGroup
		sem := make(chan struct{}, 256)
		for _, a := range agents {
			sem <- struct{}{}
			wg.Go(func() { defer func() { <-sem }(); _ = a.Stop(sctx) })
		}
		wg.Wait()
	}()
	tick := time.NewTicker(time.Second / time.Duration(o.rate))
	for i := 0; i < o.agents && ctx.Err() == nil; i++ {
		<-tick.C
		a, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + rep.opampAddr + "/v1/opamp", Secret: secret,
			Heartbeat: o.heartbeat, Credential: true, OwnMetrics: true,
			Attrs: map[string]string{"service.name": "otelcol-contrib", "load.index": strconv.Itoa(i)}})
		if err != nil {
			tick.Stop()
			return r, fmt.Errorf("agent %d: %w", i, err)
		}
		agents = append(agents, a)
	}
	tick.Stop()
	offered := func() int {
		n := 0
		for _, a := range agents {
			if a.OwnMetrics() != nil {
				n++
			}
		}
		return n
	}
	connectMax := max(3*time.Minute, 3*time.Duration(o.agents/o.rate)*time.Second)
	if !waitFor(ctx, connectMax, func() bool {
		n, _ := store.CountOnline(ctx, pool, nil)
		return n >= int64(o.agents) && offered() == o.agents
	}) {
		n, _ := store.CountOnline(ctx, pool, nil)
		return r, fmt.Errorf("after %s: %d of %d agents online, %d hold the own_metrics offer", connectMax, n, o.agents, offered())
	}
	r.ConnectAllS = round(time.Since(start).Seconds(), 1)
	r.Offered = offered()
	tprogress(stderr, "all %d agents online with the offer in %.1f s; settling %s", o.agents, r.ConnectAllS, o.settle)
	sleepCtx(ctx, o.settle)

	// Telemetry off: connected, not sending.
	read := func() pgCounters {
		c := pgCounters{at: time.Now()}
		_ = pool.QueryRow(ctx, `SELECT (tup_inserted + tup_updated + tup_deleted)::float8, xact_commit::float8,
			(pg_current_wal_lsn() - '0/0'::pg_lsn)::float8 FROM pg_stat_database WHERE datname = current_database()`).Scan(&c.writes, &c.commits, &c.wal)
		if tc, err := telemetry.ReadTableCounters(ctx, pool); err == nil {
			c.tabIns, c.tabUpd, c.tableBytes = tc.Inserts, tc.Updates, tc.Bytes
		}
		c.rep, _ = readProc(rep.pid())
		if pgDir != "" {
			c.proc, _ = readPostgres(pgDir)
		}
		m := rep.metrics()
		c.rowsWritten, c.samples = metricValue(m, "myriarch_telemetry_rows_written_total"), metricValue(m, "myriarch_telemetry_samples_total")
		return c
	}
	window := func(a, b pgCounters) phase {
		dt := b.at.Sub(a.at).Seconds()
		p := phase{Seconds: round(dt, 1), ReplicaCPUPct: round(cpuPct(a.rep, b.rep), 2), ReplicaRSSMB: round(b.rep.rss/1e6, 1),
			DBRowWritesPerS: round((b.writes-a.writes)/dt, 1), DBCommitsPerS: round((b.commits-a.commits)/dt, 1),
			WALBytesPerS: round((b.wal-a.wal)/dt, 0), LoadAvg: loadAvg()}
		if pgDir != "" {
			p.PGCPUPct = round(cpuPct(a.proc, b.proc), 2)
		}
		return p
	}
	tprogress(stderr, "telemetry off: measuring %s", o.baseline)
	off0 := read()
	sleepCtx(ctx, o.baseline)
	off1 := read()
	r.Off = window(off0, off1)
	tprogress(stderr, "telemetry off: replica %.2f %% of a core, %.0f MB RSS; load average %v", r.Off.ReplicaCPUPct, r.Off.ReplicaRSSMB, r.Off.LoadAvg)
	if ctx.Err() != nil {
		return r, ctx.Err()
	}

	// Telemetry on: every agent sends every interval, staggered.
	epoch := start.Add(-time.Hour)
	uids := make([]string, len(agents))
	for i, a := range agents {
		uids[i] = a.CurrentUID()
	}
	if body, err := payload(0, uids[0], epoch, time.Now()); err == nil {
		r.BodyBytes = len(body)
		r.MetricsPerBody = collectorMetrics(0, uids[0], epoch, time.Now()).MetricCount()
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConns: o.conns, MaxIdleConnsPerHost: o.conns,
		MaxConnsPerHost: o.conns, IdleConnTimeout: 90 * time.Second}}
	defer client.CloseIdleConnections()
	var sent, failed atomic.Int64
	var latMu sync.Mutex
	var lats []float64
	var firstErr atomic.Value
	sctx, stopSending := context.WithCancel(ctx)
	var senders sync.WaitGroup
	defer func() { stopSending(); senders.Wait() }()
	for i, a := range agents {
		om := a.OwnMetrics()
		offset := time.Duration(int64(o.interval) * int64(i) / int64(len(agents)))
		senders.Go(func() {
			t := time.NewTimer(offset)
			defer t.Stop()
			for {
				select {
				case <-sctx.Done():
					return
				case <-t.C:
				}
				t.Reset(o.interval)
				body, err := payload(i, uids[i], epoch, time.Now())
				if err != nil {
					failed.Add(1)
					continue
				}
				t0 := time.Now()
				code, err := postOwnMetrics(sctx, client, om.GetDestinationEndpoint(), om.GetHeaders().GetHeaders(), body, o.gzip)
				if sctx.Err() != nil {
					return
				}
				if err != nil || code != http.StatusOK {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("POST %s: %d %v", om.GetDestinationEndpoint(), code, err))
					continue
				}
				sent.Add(1)
				latMu.Lock()
				lats = append(lats, float64(time.Since(t0).Microseconds())/1000)
				latMu.Unlock()
			}
		})
	}
	tprogress(stderr, "telemetry on: %d agents send every %s (%d catalog series, %d bytes a body); settling %s", len(agents), o.interval,
		r.SeriesPerAgent, r.BodyBytes, o.interval+o.settle)
	sleepCtx(ctx, o.interval+o.settle)
	_, _ = pool.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	latMu.Lock()
	lats = lats[:0]
	latMu.Unlock()
	sent0, failed0 := sent.Load(), failed.Load()
	on0 := read()
	tprogress(stderr, "telemetry on: measuring %s", o.duration)
	sleepCtx(ctx, o.duration)
	on1 := read()
	r.On = window(on0, on1)
	dt := on1.at.Sub(on0.at).Seconds()
	r.Requests, r.RequestErrors = sent.Load()-sent0, failed.Load()-failed0
	r.RequestsPerS = round(float64(r.Requests)/dt, 1)
	latMu.Lock()
	r.RequestP50MS, r.RequestP99MS = round(quantile(lats, 0.5), 2), round(quantile(lats, 0.99), 2)
	latMu.Unlock()
	r.SamplesPerS = round((on1.samples-on0.samples)/dt, 1)
	r.RowsWritten = int64(on1.rowsWritten - on0.rowsWritten)
	r.RowsWrittenPerS = round((on1.rowsWritten-on0.rowsWritten)/dt, 1)
	r.TableInsertsPerS, r.TableUpdatesPerS = round((on1.tabIns-on0.tabIns)/dt, 1), round((on1.tabUpd-on0.tabUpd)/dt, 1)
	r.TableBytesStart, r.TableBytesEnd = on0.tableBytes, on1.tableBytes
	r.TableGrowthBytesPerAgentPerDay = round(float64(on1.tableBytes-on0.tableBytes)/dt*86400/float64(o.agents), 0)
	if r.Off.ReplicaCPUPct > 0 {
		r.CPURatio = round(r.On.ReplicaCPUPct/r.Off.ReplicaCPUPct, 2)
	}
	if r.Off.ReplicaRSSMB > 0 {
		r.RSSRatio = round(r.On.ReplicaRSSMB/r.Off.ReplicaRSSMB, 2)
	}
	if e, ok := firstErr.Load().(string); ok {
		r.Errors = append(r.Errors, "first failed request: "+e)
	}
	r.PGTop = pgTopOf(ctx, pool, 5)
	tprogress(stderr, "telemetry on: replica %.2f %% of a core (%.2f× off), %.0f MB RSS; %.0f requests/s, %d failed; %.1f rows/s; load average %v",
		r.On.ReplicaCPUPct, r.CPURatio, r.On.ReplicaRSSMB, r.RequestsPerS, r.RequestErrors, r.RowsWrittenPerS, r.On.LoadAvg)

	// Storage: rows and bytes per tier.
	r.LiveRows, r.RowBytes = map[string]int64{}, map[string]float64{}
	if tiers, err := telemetry.ReadTierRows(ctx, pool); err == nil {
		for _, t := range tiers {
			name := [2]string{"fine", "coarse"}[min(t.Tier, 1)]
			r.LiveRows[name], r.RowBytes[name] = t.Rows, round(t.RowBytes, 1)
		}
	}
	var total int64
	for _, n := range r.LiveRows {
		total += n
	}
	if total > 0 {
		tc, _ := telemetry.ReadTableCounters(ctx, pool)
		r.DiskBytesPerRow = round(float64(tc.Bytes)/float64(total), 1)
		tiers := tiersOf(o.extra)
		r.CoarseBytesPerAgentPerDay = round(r.DiskBytesPerRow*86400/tiers.CoarseResolution.Seconds(), 0)
		r.CoarseBytesPerAgentRetained = round(r.DiskBytesPerRow*tiers.CoarseRetention.Seconds()/tiers.CoarseResolution.Seconds(), 0)
		r.FineBytesPerAgentRetained = round(r.DiskBytesPerRow*tiers.FineRetention.Seconds()/tiers.FineResolution.Seconds(), 0)
	}

	// The UI at N agents, the agents still sending.
	sorted := slices.Clone(uids)
	slices.Sort(sorted)
	nSeed := min(o.seed, len(sorted))
	if err := seedHistory(ctx, pool, tiersOf(o.extra), sorted[:nSeed], uids, epoch); err != nil {
		r.Errors = append(r.Errors, "seeding history: "+err.Error())
	}
	st := &store.Store{Pool: pool}
	tok, err := st.CreateToken(ctx, fmt.Sprintf("telemetry-bench-%d", time.Now().UnixNano()))
	if err != nil {
		return r, err
	}
	base := "http://" + rep.httpAddr
	ui, err := uiClient(ctx, base, tok)
	if err != nil {
		return r, err
	}
	for _, p := range []struct{ page, path string }{{"overview", "/ui/"}, {"agents", "/ui/agents"}, {"agent", "/ui/agents/" + sorted[0]},
		{"api_agent_telemetry", "/api/v1/agents/" + sorted[0] + "/telemetry?window=5m"}, {"api_fleet_telemetry", "/api/v1/telemetry?window=1h"}} {
		pt, err := timePage(ctx, ui, base, tok, p.page, p.path, o.uiRequests)
		if err != nil {
			r.Errors = append(r.Errors, err.Error())
			continue
		}
		r.UI = append(r.UI, pt)
		tprogress(stderr, "%s (%s): server median %.1f ms, p99 %.1f ms; wall median %.1f ms, p99 %.1f ms; %d bytes, %d charts", p.page, p.path,
			pt.ServerMedianMS, pt.ServerP99MS, pt.MedianMS, pt.P99MS, pt.Bytes, pt.SVGs)
	}
	r.Online, _ = store.CountOnline(ctx, pool, nil)
	if len(r.Errors) > 0 {
		return r, fmt.Errorf("%s (the replica's log: %s; keep it with --dir)", strings.Join(r.Errors, "; "), logf.Name())
	}
	return r, nil
}

// tiersOf is the replica's tiers: the defaults, with what --set changed.
func tiersOf(set map[string]string) telemetry.Tiers {
	t := telemetry.DefaultTiers
	for k, p := range map[string]*time.Duration{"telemetry.fineResolution": &t.FineResolution, "telemetry.fineRetention": &t.FineRetention,
		"telemetry.coarseResolution": &t.CoarseResolution, "telemetry.coarseRetention": &t.CoarseRetention} {
		if d, err := time.ParseDuration(set[k]); err == nil {
			*p = d
		}
	}
	return t
}

// postOwnMetrics POSTs one OTLP/HTTP protobuf body with the offered headers.
func postOwnMetrics(ctx context.Context, c *http.Client, dest string, hs []*protobufs.Header, body []byte, gz bool) (int, error) {
	var rd io.Reader = bytes.NewReader(body)
	if gz {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		_, _ = zw.Write(body)
		_ = zw.Close()
		rd = &b
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, dest, rd)
	if err != nil {
		return 0, err
	}
	for _, h := range hs {
		req.Header.Set(h.Key, h.Value)
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	if gz {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// seedHistory writes 30 minutes of history for agents seed (indices from
// all) through the telemetry package's own batcher, with its clock set
// back, so that the pages timed show full charts.
func seedHistory(ctx context.Context, pool *pgxpool.Pool, tiers telemetry.Tiers, seed, all []string, epoch time.Time) error {
	index := map[string]int{}
	for i, u := range all {
		index[u] = i
	}
	var at time.Time
	b := telemetry.NewBatcher(telemetry.BatcherOptions{Pool: pool, Tiers: tiers, FlushInterval: time.Hour,
		Now: func() time.Time { return at }})
	now := time.Now()
	for t := now.Add(-30 * time.Minute); t.Before(now.Add(-2 * time.Minute)); t = t.Add(tiers.FineResolution) {
		at = t
		for _, u := range seed {
			b.Add(u, seedSamples(index[u], u, epoch, t))
		}
	}
	return b.Flush(ctx)
}

// uiClient logs in to the UI with tok and returns a client holding the
// session cookie.
func uiClient(ctx context.Context, base, tok string) (*http.Client, error) {
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Timeout: time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/ui/login", strings.NewReader(url.Values{"token": {tok}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	u, _ := url.Parse(base + "/ui/")
	if len(jar.Cookies(u)) == 0 {
		return nil, fmt.Errorf("UI login: %s, no session cookie", resp.Status)
	}
	return c, nil
}

// timePage GETs path n times (after one untimed request) and returns the
// median and p99 of the wall times.
func timePage(ctx context.Context, c *http.Client, base, tok, page, path string, n int) (pageTime, error) {
	pt := pageTime{Page: page, Path: path, Requests: n}
	var ts, server []float64
	for i := range n + 1 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		if strings.HasPrefix(path, "/api/") {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		t0 := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			return pt, fmt.Errorf("GET %s: %w", path, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		d := float64(time.Since(t0).Microseconds()) / 1000
		if err != nil || resp.StatusCode != http.StatusOK {
			return pt, fmt.Errorf("GET %s: %s %v", path, resp.Status, err)
		}
		if i == 0 {
			pt.Bytes, pt.SVGs = len(b), bytes.Count(b, []byte("<svg"))
			continue
		}
		ts = append(ts, d)
		if v, ok := strings.CutPrefix(resp.Trailer.Get("Server-Timing"), "app;dur="); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				server = append(server, f)
			}
		}
	}
	pt.MedianMS, pt.P99MS = round(quantile(ts, 0.5), 1), round(quantile(ts, 0.99), 1)
	pt.ServerMedianMS, pt.ServerP99MS = round(quantile(server, 0.5), 1), round(quantile(server, 0.99), 1)
	return pt, nil
}

// quantile is the q-quantile of xs (nearest rank; 0 for none).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// pgTopOf reads the n statements with the most time since the reset.
func pgTopOf(ctx context.Context, pool *pgxpool.Pool, n int) []pgStmt {
	rows, err := pool.Query(ctx, `SELECT left(regexp_replace(query, '\s+', ' ', 'g'), 160), calls, total_exec_time, rows
		FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		ORDER BY total_exec_time DESC LIMIT $1`, n)
	if err != nil {
		return nil
	}
	defer rows.Close()
	var out []pgStmt
	for rows.Next() {
		var s pgStmt
		if rows.Scan(&s.Query, &s.Calls, &s.TotalMS, &s.Rows) == nil {
			s.TotalMS = round(s.TotalMS, 1)
			out = append(out, s)
		}
	}
	return out
}

func printTelemetry(w io.Writer, asJSON bool, r telemetryResult) {
	if asJSON {
		b, _ := json.Marshal(r)
		fmt.Fprintln(w, string(b))
		return
	}
	fmt.Fprintf(w, "agents %d (online %d, %d with the offer), every %.0f s: %d catalog series, %d metrics, %d bytes a body; load average %v\n",
		r.Agents, r.Online, r.Offered, r.IntervalS, r.SeriesPerAgent, r.MetricsPerBody, r.BodyBytes, r.LoadAvg)
	fmt.Fprintf(w, "  replica CPU: off %.2f %%, on %.2f %% of a core (ratio %.2f); RSS off %.0f MB, on %.0f MB; load average off %v, on %v\n",
		r.Off.ReplicaCPUPct, r.On.ReplicaCPUPct, r.CPURatio, r.Off.ReplicaRSSMB, r.On.ReplicaRSSMB, r.Off.LoadAvg, r.On.LoadAvg)
	fmt.Fprintf(w, "  requests: %.1f/s, %d failed, p50 %.2f ms, p99 %.2f ms (at the agents)\n", r.RequestsPerS, r.RequestErrors, r.RequestP50MS, r.RequestP99MS)
	fmt.Fprintf(w, "  PostgreSQL: %.1f telemetry rows/s (%.1f inserts, %.1f updates), %.0f WAL bytes/s (off %.0f), %.1f %% CPU (off %.1f)\n",
		r.RowsWrittenPerS, r.TableInsertsPerS, r.TableUpdatesPerS, r.On.WALBytesPerS, r.Off.WALBytesPerS, r.On.PGCPUPct, r.Off.PGCPUPct)
	fmt.Fprintf(w, "  storage: %.0f bytes a row on disk; per agent: coarse tier %.0f bytes a day (%.0f at its retention), fine tier %.0f at its retention; measured growth %.0f bytes per agent per day\n",
		r.DiskBytesPerRow, r.CoarseBytesPerAgentPerDay, r.CoarseBytesPerAgentRetained, r.FineBytesPerAgentRetained, r.TableGrowthBytesPerAgentPerDay)
	for _, p := range r.UI {
		fmt.Fprintf(w, "  %s %s: server median %.1f ms, p99 %.1f ms; wall median %.1f ms, p99 %.1f ms (%d requests, %d bytes, %d charts)\n",
			p.Page, p.Path, p.ServerMedianMS, p.ServerP99MS, p.MedianMS, p.P99MS, p.Requests, p.Bytes, p.SVGs)
	}
	for _, e := range r.Errors {
		fmt.Fprintf(w, "  error: %s\n", e)
	}
}
