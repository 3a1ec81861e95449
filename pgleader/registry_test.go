package pgleader

import (
	"context"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/internal/testwait"
)

// Two services with different lock keys share one database: each lists and
// prunes only its own replicas, and a replica id may repeat across them.
func TestRegistryIsKeyedByLockKey(t *testing.T) {
	c := pgtest.New(t)
	pool := newPool(t, c.DSN(""))
	a := startReplica(t, pool, "same-id", func(c *Config) { c.LockKey = 101 })
	b := startReplica(t, pool, "same-id", func(c *Config) { c.LockKey = 202 })
	testwait.Until(t, "both lead their own key", 20*time.Second, func() bool { return a.e.IsLeader() && b.e.IsLeader() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A stale row of each service.
	for _, key := range []int64{101, 202} {
		if _, err := pool.Exec(ctx, `INSERT INTO `+RegistryTable+` (lock_key, id, host, version, started_at, last_heartbeat)
			VALUES ($1, 'gone', 'h', 'v', now() - interval '1 hour', now() - interval '10 minutes')`, key); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []*replica{a, b} {
		rs, err := r.e.Replicas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != 2 || rs[0].ID != "gone" || rs[1].ID != "same-id" || !rs[1].HoldsLock {
			t.Fatalf("replicas of key %d: %+v", r.e.LockKey(), rs)
		}
	}
	if n, err := PruneReplicas(ctx, pool, 101, 5*time.Minute); err != nil || n != 1 {
		t.Fatalf("prune of key 101: %d, %v", n, err)
	}
	rs, err := ReadReplicas(ctx, pool, 202, time.Minute)
	if err != nil || len(rs) != 2 {
		t.Fatalf("key 202 after pruning key 101: %+v, %v", rs, err)
	}
	cur, ok, err := CurrentTerm(ctx, pool, 202)
	if err != nil || !ok || cur.Term != b.e.Term() || cur.LeaderID != "same-id" {
		t.Fatalf("CurrentTerm(202) = %+v, %v, %v; replica b leads term %d", cur, ok, err, b.e.Term())
	}
	if _, ok, err := CurrentTerm(ctx, pool, 303); ok || err != nil {
		t.Fatalf("CurrentTerm of a key never elected: ok %v, %v", ok, err)
	}
}

// A registry table of the earlier layout (primary key id, no lock key) is
// keyed by EnsureSchema: its rows get the default key, and replicas work on
// it afterwards.
func TestRegistryMigrationFromUnkeyedTable(t *testing.T) {
	c := pgtest.New(t)
	pool := newPool(t, c.DSN(""))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+RegistryTable+` (
			id text PRIMARY KEY, host text NOT NULL, version text NOT NULL, started_at timestamptz NOT NULL,
			last_heartbeat timestamptz NOT NULL, is_leader boolean NOT NULL DEFAULT false, lock_pid integer);
		INSERT INTO `+RegistryTable+` (id, host, version, started_at, last_heartbeat) VALUES ('old', 'h', 'v1', now(), now())`); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the migration runs again as a no-op
		if err := EnsureSchema(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	var pk string
	if err := pool.QueryRow(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'p'`,
		RegistryTable).Scan(&pk); err != nil || pk != "PRIMARY KEY (lock_key, id)" {
		t.Fatalf("primary key after the migration: %q, %v", pk, err)
	}
	a := startReplica(t, pool, "old", nil)
	testwait.Until(t, "a leads", 20*time.Second, a.e.IsLeader)
	rs, err := a.e.Replicas(ctx)
	if err != nil || len(rs) != 1 || rs[0].ID != "old" || rs[0].Version != "test" || !rs[0].HoldsLock {
		t.Fatalf("replicas after the migration: %+v, %v", rs, err)
	}
}

// The fast path: a follower's lock session waits on the lock itself in the
// server's lock queue (not in a sleep between tries), so the server hands
// it the lock when the holder lets go; after a planned stop of the leader
// it leads. A statement_timeout of the database shorter than the wait does
// not cut the waits short (the session would otherwise be replaced after
// every timeout).
func TestFollowerWaitsOnTheLock(t *testing.T) {
	c := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := c.Psql(ctx, "ALTER DATABASE postgres SET statement_timeout = '300ms'"); err != nil {
		t.Fatal(err, out)
	}
	pool := newPool(t, c.DSN(""))
	a := startReplica(t, pool, "a", nil)
	testwait.Until(t, "a leads", 20*time.Second, a.e.IsLeader)
	b := startReplica(t, pool, "b", nil)
	waiting := func() bool {
		pid := b.e.lockPID.Load()
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND NOT l.granted
			AND l.pid = $1 AND l.objid::bigint = ($2::bigint & 4294967295))`, pid, b.e.LockKey()).Scan(&waiting)
		return pid != 0 && err == nil && waiting
	}
	testwait.Until(t, "b's lock session waits in the lock queue", 30*time.Second, waiting)
	pid := b.e.lockPID.Load()
	time.Sleep(time.Second) // more than the statement_timeout
	testwait.Until(t, "b's lock session waits again", 10*time.Second, waiting)
	if b.e.lockPID.Load() != pid {
		t.Fatalf("b's lock session %d no longer waits (now %d) after the database's statement_timeout", pid, b.e.lockPID.Load())
	}
	a.stop(t)
	testwait.Until(t, "b leads", 20*time.Second, b.e.IsLeader)
	if b.e.Term() <= a.lastTerm() {
		t.Fatalf("b leads term %d after a's term %d", b.e.Term(), a.lastTerm())
	}
}
