package jobs

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/pgleader"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSweeperAndHousekeepingRunUnderTheLeaderWithFencedWrites(t *testing.T) {
	pg := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := store.Open(ctx, pg.DSN(""), 8, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	elected := make(chan *pgleader.Leadership, 1)
	el, err := pgleader.New(pgleader.Config{Pool: st.Pool, LeaderSessionTimeout: 10 * time.Second, ID: "r1",
		OnElected: func(l *pgleader.Leadership) { elected <- l }})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { el.Run(ctx) })

	old := time.Now().Add(-time.Hour)
	st.Connected(ctx, "stale", "dead-replica", "x#1", old)
	st.Connected(ctx, "fresh", "r1", "y#1", time.Now())
	st.InsertEvents(ctx, []store.Event{{InstanceUID: "fresh", At: old.Add(-30 * 24 * time.Hour), Kind: "ancient"}})

	swept := make(chan int, 10)
	r := NewRunner([]Job{
		OfflineSweeper(50*time.Millisecond, time.Minute, func(n int) { swept <- n }),
		Housekeeping(50*time.Millisecond, 24*time.Hour, time.Hour, el.LockKey()),
	}, "r1", nil, nil)

	var l *pgleader.Leadership
	select {
	case l = <-elected:
	case <-time.After(30 * time.Second):
		t.Fatal("not elected")
	}
	lctx, term := l.Context(), l.Term()
	// A stale registry row of this service's lock key and one of another
	// service's key in the same database: housekeeping prunes only its own.
	for _, key := range []int64{el.LockKey(), el.LockKey() + 1} {
		if _, err := st.Pool.Exec(ctx, `INSERT INTO `+pgleader.RegistryTable+` (lock_key, id, host, version, started_at, last_heartbeat)
			VALUES ($1, 'gone', 'h', 'v', now() - interval '3 hours', now() - interval '2 hours')`, key); err != nil {
			t.Fatal(err)
		}
	}
	jctx, jstop := context.WithCancel(lctx)
	done := make(chan struct{})
	go func() { r.Lead(jctx, term, l.InTerm); close(done) }()
	if !fleettest.Eventually(30*time.Second, func() bool {
		a, _ := st.GetAgent(ctx, "stale")
		return a.Status == "offline"
	}) {
		t.Fatal("stale agent not swept")
	}
	if a, _ := st.GetAgent(ctx, "fresh"); a.Status != "online" {
		t.Fatal("fresh agent swept")
	}
	if !fleettest.Eventually(30*time.Second, func() bool {
		evs, _ := st.Events(ctx, "fresh", 10)
		return len(evs) == 0
	}) {
		t.Fatal("old event not pruned")
	}
	if !fleettest.Eventually(30*time.Second, func() bool {
		rs, _ := pgleader.ReadReplicas(ctx, st.Pool, el.LockKey(), time.Hour)
		return len(rs) == 1 && rs[0].ID == "r1"
	}) {
		rs, _ := pgleader.ReadReplicas(ctx, st.Pool, el.LockKey(), time.Hour)
		t.Fatalf("stale registry row not pruned: %+v", rs)
	}
	if rs, err := pgleader.ReadReplicas(ctx, st.Pool, el.LockKey()+1, time.Hour); err != nil || len(rs) != 1 {
		t.Fatalf("housekeeping pruned another service's registry: %+v, %v", rs, err)
	}
	evs, _ := st.Events(ctx, "stale", 10)
	if len(evs) != 1 || evs[0].Kind != store.EventMarkedOffline {
		t.Fatalf("sweeper event: %+v", evs)
	}
	if !fleettest.Eventually(30*time.Second, func() bool {
		runs, _ := st.JobRuns(ctx)
		return len(runs) == 2 && runs[0].Term == term && runs[0].Runs > 0
	}) {
		runs, _ := st.JobRuns(ctx)
		t.Fatalf("job runs: %+v", runs)
	}
	for _, s := range r.Statuses() {
		if s.Runs == 0 || s.Error != "" || s.Term != term {
			t.Fatalf("status %+v", s)
		}
	}
	jstop()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("jobs did not stop with their context")
	}
}

func TestAStaleFenceWritesNothing(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	st, err := store.Open(ctx, pg.DSN(""), 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.Connected(ctx, "stale", "dead", "x#1", time.Now().Add(-time.Hour))
	// The fence of a term that is over (its replica stopped) refuses.
	elected := make(chan *pgleader.Leadership, 1)
	el, err := pgleader.New(pgleader.Config{Pool: st.Pool, LeaderSessionTimeout: 10 * time.Second, ID: "r2",
		OnElected: func(l *pgleader.Leadership) { elected <- l }})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rstop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { el.Run(rctx); close(ran) }()
	var l *pgleader.Leadership
	select {
	case l = <-elected:
	case <-time.After(30 * time.Second):
		t.Fatal("not elected")
	}
	rstop()
	<-ran
	j := OfflineSweeper(time.Second, time.Minute, nil)
	if err := j.Run(ctx, l.InTerm); !errors.Is(err, pgleader.ErrStaleTerm) {
		t.Fatalf("err %v", err)
	}
	if a, _ := st.GetAgent(ctx, "stale"); a.Status != "online" {
		t.Fatal("a write without a current term committed")
	}
	var fence Fence = func(ctx context.Context, fn func(context.Context, pgx.Tx) error) error { return errors.New("boom") }
	r := NewRunner([]Job{j}, "r2", nil, nil)
	c, stop := context.WithCancel(ctx)
	go func() { time.Sleep(100 * time.Millisecond); stop() }()
	r.Lead(c, 1, fence)
	if s := r.Statuses()[0]; s.Failures == 0 || s.Error != "boom" {
		t.Fatalf("status %+v", s)
	}
}
