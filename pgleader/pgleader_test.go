package pgleader

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/pgtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const testT = 10 * time.Second

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func newPool(t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

type replica struct {
	e      *Elector
	cancel context.CancelFunc
	done   chan error
	reg    *prometheus.Registry
}

func startReplica(t testing.TB, pool *pgxpool.Pool, id string, mod func(*Config)) *replica {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := Config{Pool: pool, LeaderSessionTimeout: testT, HeartbeatInterval: time.Second, ID: id,
		Version: "test", Logger: testLogger(t).With("id", id), Registerer: reg}
	if mod != nil {
		mod(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{e: e, cancel: cancel, done: make(chan error, 1), reg: reg}
	go func() { r.done <- e.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *replica) stop(t testing.TB) time.Duration {
	start := time.Now()
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		r.done <- nil
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return")
	}
	return time.Since(start)
}

func waitFor(t testing.TB, what string, limit time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < limit {
		if cond() {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v", what, limit)
	return 0
}

func TestSessionReportsDerivedParameters(t *testing.T) {
	c := pgtest.New(t)
	pool := newPool(t, c.DSN(""))
	e, err := New(Config{Pool: pool, LeaderSessionTimeout: testT, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := e.ConnectSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	k := e.Keepalive()
	want := map[string]string{
		"tcp_keepalives_idle":     strconv.Itoa(int(k.KeepalivesIdle / time.Second)),
		"tcp_keepalives_interval": strconv.Itoa(int(k.KeepalivesInterval / time.Second)),
		"tcp_keepalives_count":    strconv.Itoa(k.KeepalivesCount),
		"tcp_user_timeout":        strconv.FormatInt(k.UserTimeout.Milliseconds(), 10),
	}
	for name, v := range want {
		var got string
		if err := conn.QueryRow(ctx, "SHOW "+name).Scan(&got); err != nil {
			t.Fatal(err)
		}
		// SHOW prints the units of the setting: seconds "2s", milliseconds "6000ms".
		if got != v && got != v+"s" && got != v+"ms" {
			t.Errorf("SHOW %s = %q, want %s", name, got, v)
		}
	}
	// The pool keeps the server defaults.
	var idle string
	if err := pool.QueryRow(ctx, "SHOW tcp_keepalives_idle").Scan(&idle); err != nil {
		t.Fatal(err)
	}
	if idle == want["tcp_keepalives_idle"] || idle == want["tcp_keepalives_idle"]+"s" {
		t.Errorf("pool connection has the session keepalives: %q", idle)
	}
}

func TestElectionFencingAndPlannedStop(t *testing.T) {
	c := pgtest.New(t)
	pool := newPool(t, c.DSN(""))
	var elected atomic.Int64
	a := startReplica(t, pool, "a", func(c *Config) {
		c.OnElected = func(ctx context.Context, term int64) { elected.Store(term) }
	})
	waitFor(t, "a leads", 20*time.Second, a.e.IsLeader)
	b := startReplica(t, pool, "b", nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := pool.Exec(ctx, "CREATE TABLE jobs (term bigint, who text)"); err != nil {
		t.Fatal(err)
	}
	termA := a.e.Term()
	if termA < 1 || elected.Load() != termA {
		t.Fatalf("term %d, OnElected %d", termA, elected.Load())
	}
	write := func(r *replica) error {
		return r.e.InTerm(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO jobs VALUES ($1, $2)", r.e.LastTerm(), r.e.ID())
			return err
		})
	}
	if err := write(a); err != nil {
		t.Fatal(err)
	}
	if err := write(b); !errors.Is(err, ErrStaleTerm) {
		t.Fatalf("follower write: %v", err)
	}
	// Registry shows both, a as lock holder.
	waitFor(t, "registry", 10*time.Second, func() bool {
		rs, err := a.e.Replicas(ctx)
		if err != nil || len(rs) != 2 {
			return false
		}
		return rs[0].ID == "a" && rs[0].HoldsLock && rs[0].IsLeader && !rs[1].HoldsLock && rs[1].LockPID != 0 && !rs[0].Stale
	})
	if got := testutil.ToFloat64(a.e.m.leader); got != 1 {
		t.Fatalf("myriarch_leader = %v", got)
	}

	took := a.stop(t)
	if took > ReleaseTimeout {
		t.Errorf("planned stop took %v", took)
	}
	if err := write(a); !errors.Is(err, ErrStaleTerm) {
		t.Fatalf("stopped leader write: %v", err)
	}
	k := b.e.Keepalive()
	waitFor(t, "b leads", k.FollowerRetryMax+5*time.Second, b.e.IsLeader)
	if b.e.Term() <= termA {
		t.Fatalf("term did not increase: %d after %d", b.e.Term(), termA)
	}
	if err := write(b); err != nil {
		t.Fatal(err)
	}
	// A transaction fenced by the old term is rejected by the database.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return CheckTerm(ctx, tx, DefaultLockKey, termA) })
	if !errors.Is(err, ErrStaleTerm) {
		t.Fatalf("CheckTerm old term: %v", err)
	}
	if got := testutil.ToFloat64(a.e.m.resignations.WithLabelValues(ReasonStop)); got != 1 {
		t.Fatalf("resignations{stop} = %v", got)
	}
	if got := testutil.ToFloat64(a.e.m.leader); got != 0 {
		t.Fatalf("myriarch_leader after stop = %v", got)
	}
}
