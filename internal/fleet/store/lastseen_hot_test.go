package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/pgtest"
)

// A last-seen flush changes no indexed column of agents (00070): its
// updates can be HOT (the new row version on the same page, no index
// entry written). With last_seen indexed (before 00070) none could be.
func TestFlushSeenUpdatesAreHOT(t *testing.T) {
	pg := pgtest.New(t)
	s := open(t, pg.DSN(""))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 500
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	batch := make([]Seen, n)
	for i := range n {
		uid, conn := fmt.Sprintf("hot-%d", i), fmt.Sprintf("p1#%d", i)
		if _, err := s.Connected(ctx, uid, "r1", conn, t0); err != nil {
			t.Fatal(err)
		}
		batch[i] = Seen{UID: uid, ConnID: conn, At: t0.Add(time.Minute)}
	}
	// pg_stat_user_tables counts what this backend did once it flushed
	// its statistics: one connection does the updates and reads them.
	conn, err := s.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	counters := func() (upd, hot int64) {
		t.Helper()
		if _, err := conn.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'agents'`).Scan(&upd, &hot); err != nil {
			t.Fatal(err)
		}
		return upd, hot
	}
	upd0, hot0 := counters()
	uids := make([]string, n)
	conns := make([]string, n)
	ats := make([]time.Time, n)
	reps := make([]string, n)
	for i, b := range batch {
		uids[i], conns[i], ats[i] = b.UID, b.ConnID, b.At
	}
	// The statement of FlushSeen, on this connection.
	tag, err := conn.Exec(ctx, flushSeenSQL, uids, conns, ats, reps)
	if err != nil || tag.RowsAffected() != n {
		t.Fatalf("flush: %d rows, %v", tag.RowsAffected(), err)
	}
	upd1, hot1 := counters()
	// With last_seen indexed none could be HOT; now those whose page has
	// room for the new version are (fillfactor 80: a fifth of each page).
	if upd1-upd0 != n || hot1-hot0 == 0 {
		t.Fatalf("%d of the flush's %d updates were HOT (%d updates counted)", hot1-hot0, n, upd1-upd0)
	}
	t.Logf("%d of %d last-seen updates HOT in one flush of fresh rows", hot1-hot0, n)
	// The offline sweep still finds its rows through agents_status.
	if _, err := s.Pool.Exec(ctx, `UPDATE agents SET last_seen = now() - interval '1 hour' WHERE instance_uid = 'hot-0'`); err != nil {
		t.Fatal(err)
	}
	if swept, err := SweepOffline(ctx, s.Pool, time.Minute); err != nil || swept != 1 {
		t.Fatalf("sweep: %d %v", swept, err)
	}
}
