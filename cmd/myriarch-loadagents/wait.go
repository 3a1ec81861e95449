package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/myriarch/myriarch/pgleader"
)

func runWait(ctx context.Context, args []string, out *emitter, stderr io.Writer) error {
	fs := flag.NewFlagSet("wait", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsn := fs.String("dsn", "", "PostgreSQL URL")
	n := fs.Int64("agents", 0, "agents expected")
	replica := fs.String("replica", "", "replica expected to hold them all")
	since := fs.Float64("since", 0, "unix time (s) of the kill; default now")
	leader := fs.Bool("leader", false, "also wait until the replica leads (the current term names it)")
	lockKey := fs.Int64("lock-key", pgleader.DefaultLockKey, "ha.leaderLockKey of the replicas")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
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
	atStart, _, _ := pgleader.CurrentTerm(ctx, conn, *lockKey)
	out.emit(map[string]any{"event": "online_by_replica_at_start", "online": dist, "recorded_leader": atStart.LeaderID})
	for ctx.Err() == nil {
		var onR, online, other int64
		err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'online' AND replica_id = $1), count(*) FILTER (WHERE status = 'online'),
			count(*) FILTER (WHERE status = 'online' AND replica_id <> $1) FROM agents`, *replica).Scan(&onR, &online, &other)
		if err == nil && onR >= *n && other == 0 && firstAll == 0 {
			firstAll = time.Since(t0)
			out.emit(map[string]any{"event": "all_on_survivor", "agents": onR, "after_kill_s": firstAll.Seconds()})
		}
		if *leader && led == 0 {
			if cur, ok, err := pgleader.CurrentTerm(ctx, conn, *lockKey); err == nil && ok && cur.LeaderID == *replica {
				led = time.Since(t0)
				out.emit(map[string]any{"event": "survivor_leads", "term": cur.Term, "after_kill_s": led.Seconds()})
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
