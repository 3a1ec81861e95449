package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/myriarch/myriarch/internal/fleet/store"
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
	dist, err := store.OnlineByReplica(ctx, conn)
	if err != nil {
		return err
	}
	atStart, _, _ := pgleader.CurrentTerm(ctx, conn, *lockKey)
	out.emit(map[string]any{"event": "online_by_replica_at_start", "online": dist, "recorded_leader": atStart.LeaderID})
	for ctx.Err() == nil {
		onR, _, other, err := store.OnlineOn(ctx, conn, *replica)
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
