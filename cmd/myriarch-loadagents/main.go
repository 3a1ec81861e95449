// Command myriarch-loadagents is the load tool of myriarchd: it connects
// many simulated agents (real opamp-go WebSocket clients) and measures the
// server, and it has a small TCP load balancer for the failover scenario.
//
//	myriarch-loadagents agents --url ws://127.0.0.1:4320/v1/opamp --secret S --agents 10000 \
//	    --metrics http://127.0.0.1:8080/metrics --dsn postgres://... --hold 90s
//	myriarch-loadagents proxy --listen 127.0.0.1:4400 --backends 127.0.0.1:4321,127.0.0.1:4322
//	myriarch-loadagents wait --dsn postgres://... --agents 6000 --replica r2
//
// Every command prints JSON lines.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/myriarch/myriarch/internal/fleet/fleettest"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: myriarch-loadagents agents|proxy|wait [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "agents":
		err = runAgents(ctx, os.Args[2:])
	case "proxy":
		err = runProxy(ctx, os.Args[2:])
	case "wait":
		err = runWait(ctx, os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "myriarch-loadagents:", err)
		os.Exit(1)
	}
}

func emit(v map[string]any) {
	v["at"] = time.Now().UTC().Format(time.RFC3339Nano)
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
}

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
	err = conn.QueryRow(ctx, `SELECT count(*) FROM agents WHERE status = 'online'`).Scan(&s.online)
	return s, err
}

func runAgents(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("agents", flag.ExitOnError)
	url := fs.String("url", "ws://127.0.0.1:4320/v1/opamp", "OpAMP URL; several comma-separated URLs are used round-robin")
	secret := fs.String("secret", "", "enrollment secret")
	n := fs.Int("agents", 1000, "number of agents")
	rate := fs.Int("rate", 500, "agents started per second")
	hb := fs.Duration("heartbeat", 30*time.Second, "agent heartbeat interval")
	metrics := fs.String("metrics", "", "myriarchd /metrics URL to sample (CPU, memory)")
	dsn := fs.String("dsn", "", "PostgreSQL URL to sample (writes, online agents)")
	hold := fs.Duration("hold", 90*time.Second, "how long to hold all agents connected while measuring")
	every := fs.Duration("every", 10*time.Second, "report interval")
	_ = fs.Parse(args)

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
	emit(map[string]any{"event": "connected", "agents": len(agents), "start_errors": startErrs.Load(), "connected": connected(),
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
			emit(line)
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
	emit(sum)

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
func runProxy(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("proxy", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:4400", "listen address")
	backends := fs.String("backends", "", "comma-separated backend addresses")
	_ = fs.Parse(args)
	bs := strings.Split(*backends, ",")
	if len(bs) == 0 || bs[0] == "" {
		return errors.New("--backends is required")
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	emit(map[string]any{"event": "proxy_listening", "listen": l.Addr().String(), "backends": bs})
	go func() { <-ctx.Done(); l.Close() }()
	var next atomic.Uint64
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		wg.Go(func() {
			defer c.Close()
			i := next.Add(1)
			var b net.Conn
			for k := range len(bs) {
				b, err = net.DialTimeout("tcp", bs[(int(i)+k)%len(bs)], 2*time.Second)
				if err == nil {
					break
				}
			}
			if b == nil {
				return
			}
			defer b.Close()
			done := make(chan struct{}, 2)
			// Plain copies: io.Copy between two TCP connections splices
			// through a pipe, two more file descriptors per direction,
			// which would triple the descriptors per agent.
			go func() { pipe(b, c); done <- struct{}{} }()
			go func() { pipe(c, b); done <- struct{}{} }()
			select {
			case <-done:
			case <-ctx.Done():
			}
			c.Close()
			b.Close()
			<-done
		})
	}
}

func pipe(dst, src net.Conn) {
	buf := make([]byte, 8<<10)
	_, _ = io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, buf)
	_ = dst.(*net.TCPConn).CloseWrite()
}

// runWait polls the database until n agents are online on replica and
// prints how long that took.
func runWait(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("wait", flag.ExitOnError)
	dsn := fs.String("dsn", "", "PostgreSQL URL")
	n := fs.Int64("agents", 0, "agents expected")
	replica := fs.String("replica", "", "replica expected to hold them all")
	since := fs.Float64("since", 0, "unix time (s) of the kill; default now")
	leader := fs.Bool("leader", false, "also wait until the replica leads (term row names it)")
	_ = fs.Parse(args)
	conn, err := pgx.Connect(ctx, *dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	t0 := time.Now()
	if *since > 0 {
		t0 = time.Unix(0, int64(*since*1e9))
	}
	var firstAll, led time.Duration
	rows, err := conn.Query(ctx, `SELECT replica_id, count(*) FROM agents WHERE status = 'online' GROUP BY 1 ORDER BY 1`)
	if err != nil {
		return err
	}
	dist := map[string]int64{}
	var rid string
	var cnt int64
	_, err = pgx.ForEachRow(rows, []any{&rid, &cnt}, func() error { dist[rid] = cnt; return nil })
	if err != nil {
		return err
	}
	var leaderAtStart string
	_ = conn.QueryRow(ctx, `SELECT leader_id FROM myriarch_leader_term`).Scan(&leaderAtStart)
	emit(map[string]any{"event": "online_by_replica_at_start", "online": dist, "recorded_leader": leaderAtStart})
	for ctx.Err() == nil {
		var onR, online, other int64
		err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'online' AND replica_id = $1), count(*) FILTER (WHERE status = 'online'),
			count(*) FILTER (WHERE status = 'online' AND replica_id <> $1) FROM agents`, *replica).Scan(&onR, &online, &other)
		if err == nil && onR >= *n && other == 0 && firstAll == 0 {
			firstAll = time.Since(t0)
			emit(map[string]any{"event": "all_on_survivor", "agents": onR, "after_kill_s": firstAll.Seconds()})
		}
		if *leader && led == 0 {
			var id string
			var term int64
			if conn.QueryRow(ctx, `SELECT leader_id, term FROM myriarch_leader_term`).Scan(&id, &term) == nil && id == *replica {
				led = time.Since(t0)
				emit(map[string]any{"event": "survivor_leads", "term": term, "after_kill_s": led.Seconds()})
			}
		}
		if firstAll > 0 && (!*leader || led > 0) {
			return nil
		}
		if time.Since(t0) > 10*time.Minute {
			return fmt.Errorf("timeout: %d online on %s, %d online elsewhere", onR, *replica, other)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return ctx.Err()
}
