package main

import (
	"context"
	"flag"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// serverSample is read from myriarchd's /metrics.
type serverSample struct {
	at          time.Time
	cpuSeconds  float64
	rssBytes    float64
	heapInuse   float64
	goroutines  float64
	connections float64
	rows        float64
}

func scrape(url string) (serverSample, error) {
	s := serverSample{at: time.Now()}
	resp, err := http.Get(url)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return s, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		name, val, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		f, _ := strconv.ParseFloat(strings.TrimSpace(val), 64)
		switch name {
		case "process_cpu_seconds_total":
			s.cpuSeconds = f
		case "process_resident_memory_bytes":
			s.rssBytes = f
		case "go_memstats_heap_inuse_bytes":
			s.heapInuse = f
		case "go_goroutines":
			s.goroutines = f
		case "myriarch_opamp_connections":
			s.connections = f
		case "myriarch_lastseen_rows_total":
			s.rows = f
		}
	}
	return s, nil
}

type dbSample struct {
	commits, writes float64
	online          int64
}

func dbStats(ctx context.Context, conn *pgx.Conn) (dbSample, error) {
	var s dbSample
	err := conn.QueryRow(ctx, `SELECT xact_commit::float8, (tup_inserted + tup_updated + tup_deleted)::float8 FROM pg_stat_database WHERE datname = current_database()`).
		Scan(&s.commits, &s.writes)
	if err != nil {
		return s, err
	}
	s.online, err = store.CountOnline(ctx, conn, nil)
	return s, err
}

func runAgents(ctx context.Context, args []string, out *emitter, stderr io.Writer) error {
	fs := flag.NewFlagSet("agents", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "ws://127.0.0.1:4320/v1/opamp", "OpAMP URL; several comma-separated URLs are used round-robin")
	secret := fs.String("secret", "", "enrollment secret")
	n := fs.Int("agents", 1000, "number of agents")
	rate := fs.Int("rate", 500, "agents started per second")
	hb := fs.Duration("heartbeat", 30*time.Second, "agent heartbeat interval")
	metrics := fs.String("metrics", "", "myriarchd /metrics URL to sample (CPU, memory)")
	dsn := fs.String("dsn", "", "PostgreSQL URL to sample (writes, online agents)")
	hold := fs.Duration("hold", 90*time.Second, "how long to hold all agents connected while measuring")
	every := fs.Duration("every", 10*time.Second, "report interval")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}

	var base serverSample
	var err error
	if *metrics != "" {
		if base, err = scrape(*metrics); err != nil {
			return err
		}
	}
	var db *pgx.Conn
	if *dsn != "" {
		if db, err = pgx.Connect(ctx, *dsn); err != nil {
			return err
		}
		defer db.Close(context.Background())
	}

	urls := strings.Split(*url, ",")
	start := time.Now()
	agents := make([]*fleettest.Agent, 0, *n)
	var mu sync.Mutex
	var startErrs atomic.Int64
	tick := time.NewTicker(time.Second / time.Duration(max(1, *rate)))
	for i := 0; i < *n && ctx.Err() == nil; i++ {
		<-tick.C
		a, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: urls[i%len(urls)], Secret: *secret, Heartbeat: *hb,
			Attrs: map[string]string{"load.index": strconv.Itoa(i)}})
		if err != nil {
			startErrs.Add(1)
			continue
		}
		mu.Lock()
		agents = append(agents, a)
		mu.Unlock()
	}
	tick.Stop()
	started := time.Since(start)
	connectedAll := time.Duration(0)
	connected := func() int {
		c := 0
		for _, a := range agents {
			if a.Connects() > 0 {
				c++
			}
		}
		return c
	}
	for ctx.Err() == nil {
		if connected() == len(agents) {
			connectedAll = time.Since(start)
			break
		}
		if time.Since(start) > 10*time.Minute {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	dbAll := time.Duration(0)
	if db != nil {
		for ctx.Err() == nil && time.Since(start) < 10*time.Minute {
			s, err := dbStats(ctx, db)
			if err == nil && s.online >= int64(len(agents)) {
				dbAll = time.Since(start)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	out.emit(map[string]any{"event": "connected", "agents": len(agents), "start_errors": startErrs.Load(), "connected": connected(),
		"start_all_s": started.Seconds(), "connect_all_s": connectedAll.Seconds(), "online_in_db_s": dbAll.Seconds(), "rate_per_s": *rate})

	// Steady state: sample server and database over the hold period.
	var first, last serverSample
	var dbFirst, dbLast dbSample
	if *metrics != "" {
		first, _ = scrape(*metrics)
	}
	if db != nil {
		dbFirst, _ = dbStats(ctx, db)
	}
	holdStart := time.Now()
	t := time.NewTicker(*every)
	for ctx.Err() == nil && time.Since(holdStart) < *hold {
		select {
		case <-ctx.Done():
		case <-t.C:
			line := map[string]any{"event": "sample", "elapsed_s": time.Since(holdStart).Seconds(), "connected": connected()}
			if *metrics != "" {
				if s, err := scrape(*metrics); err == nil {
					line["server_connections"] = s.connections
					line["server_rss_mb"] = s.rssBytes / 1e6
					line["server_goroutines"] = s.goroutines
				}
			}
			if db != nil {
				if s, err := dbStats(ctx, db); err == nil {
					line["db_online"] = s.online
				}
			}
			out.emit(line)
		}
	}
	t.Stop()
	holdS := time.Since(holdStart).Seconds()
	sum := map[string]any{"event": "summary", "agents": len(agents), "heartbeat_s": hb.Seconds(), "hold_s": holdS,
		"connect_all_s": connectedAll.Seconds(), "online_in_db_s": dbAll.Seconds()}
	if *metrics != "" {
		last, _ = scrape(*metrics)
		sum["server_cpu_cores_steady"] = (last.cpuSeconds - first.cpuSeconds) / last.at.Sub(first.at).Seconds()
		sum["server_cpu_s_connect_phase"] = first.cpuSeconds - base.cpuSeconds
		sum["server_rss_mb"] = last.rssBytes / 1e6
		sum["server_rss_kb_per_agent"] = (last.rssBytes - base.rssBytes) / 1e3 / float64(max(1, len(agents)))
		sum["server_heap_kb_per_agent"] = (last.heapInuse - base.heapInuse) / 1e3 / float64(max(1, len(agents)))
		sum["server_goroutines"] = last.goroutines
		sum["server_goroutines_per_agent"] = (last.goroutines - base.goroutines) / float64(max(1, len(agents)))
		sum["lastseen_rows_per_s"] = (last.rows - first.rows) / last.at.Sub(first.at).Seconds()
	}
	if db != nil {
		dbLast, _ = dbStats(ctx, db)
		sum["db_commits_per_s"] = (dbLast.commits - dbFirst.commits) / holdS
		sum["db_row_writes_per_s"] = (dbLast.writes - dbFirst.writes) / holdS
		sum["db_online"] = dbLast.online
	}
	out.emit(sum)

	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 200)
	for _, a := range agents {
		sem <- struct{}{}
		wg.Go(func() { defer func() { <-sem }(); _ = a.Stop(sctx) })
	}
	wg.Wait()
	return nil
}

// runProxy is a TCP load balancer: new connections go round-robin to the
// backends; a backend that refuses is skipped.
