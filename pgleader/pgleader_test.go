package pgleader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/internal/testwait"
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
	lead   atomic.Pointer[Leadership] // the last term's, from OnElected
}

// lastTerm is the last term the replica led in (0: never).
func (r *replica) lastTerm() int64 {
	if l := r.lead.Load(); l != nil {
		return l.Term()
	}
	return 0
}

// inTerm writes through the last term's Leadership, as a leader job does.
func (r *replica) inTerm(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	l := r.lead.Load()
	if l == nil {
		return &StaleTermError{Reason: "never elected"}
	}
	return l.InTerm(ctx, fn)
}

func startReplica(t testing.TB, pool *pgxpool.Pool, id string, mod func(*Config)) *replica {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := Config{Pool: pool, LeaderSessionTimeout: testT, HeartbeatInterval: time.Second, ID: id,
		Version: "test", Logger: testLogger(t).With("id", id), Registerer: reg}
	if mod != nil {
		mod(&cfg)
	}
	r := &replica{done: make(chan error, 1), reg: reg}
	onElected := cfg.OnElected
	cfg.OnElected = func(l *Leadership) {
		// The test's own callback first: waitLeads, which waits for lead,
		// then also sees what that callback recorded.
		if onElected != nil {
			onElected(l)
		}
		r.lead.Store(l)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.e, r.cancel = e, cancel
	go func() { r.done <- e.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// waitLeads waits until the replica leads and OnElected has run for its
// term. IsLeader turns true when the term is published, before the elector
// calls OnElected (which starts the jobs), so a test that goes on to write
// through the term's Leadership must wait for both.
func (r *replica) waitLeads(t testing.TB, what string, limit time.Duration) time.Duration {
	t.Helper()
	return testwait.Until(t, what, limit, func() bool {
		term := r.e.Term()
		return term != 0 && r.lastTerm() == term
	})
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

// Test (2) of the spec: the lock session itself (the connection that holds
// the advisory lock, identified through pg_locks, asked with SHOW when it
// was opened) and the listener's session report the derived parameters;
// the pool keeps the server defaults.
func TestSessionReportsDerivedParameters(t *testing.T) {
	c := pgtest.New(t)
	pool := newPool(t, c.DSN(""))
	k, err := failover.DeriveLeaderKeepalive(testT)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"tcp_keepalives_idle":     strconv.Itoa(int(k.KeepalivesIdle / time.Second)),
		"tcp_keepalives_interval": strconv.Itoa(int(k.KeepalivesInterval / time.Second)),
		"tcp_keepalives_count":    strconv.Itoa(k.KeepalivesCount),
		"tcp_user_timeout":        strconv.FormatInt(k.UserTimeout.Milliseconds(), 10),
	}
	// Every dedicated session answers SHOW right after it connected,
	// recorded by backend pid.
	var mu sync.Mutex
	sessions := map[uint32]map[string]string{}
	scfg := pool.Config().ConnConfig.Copy()
	scfg.AfterConnect = func(ctx context.Context, pc *pgconn.PgConn) error {
		show := map[string]string{}
		for name := range want {
			res := pc.ExecParams(ctx, "SHOW "+name, nil, nil, nil, nil).Read()
			if res.Err != nil {
				return res.Err
			}
			show[name] = string(res.Rows[0][0])
		}
		mu.Lock()
		sessions[pc.PID()] = show
		mu.Unlock()
		return nil
	}
	e, err := New(Config{Pool: pool, SessionConfig: scfg, LeaderSessionTimeout: testT, ID: "a", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(runCtx) }()
	defer func() { stop(); <-done }()
	testwait.Until(t, "a leads", 20*time.Second, e.IsLeader)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	check := func(session string, show func(name string) (string, error)) {
		t.Helper()
		for name, v := range want {
			got, err := show(name)
			if err != nil {
				t.Fatalf("%s: SHOW %s: %v", session, name, err)
			}
			t.Logf("%s: SHOW %s = %s", session, name, got)
			// PostgreSQL 15 prints plain numbers; accept a unit suffix too.
			if got != v && got != v+"s" && got != v+"ms" {
				t.Errorf("%s: SHOW %s = %q, want %s", session, name, got, v)
			}
		}
	}

	// The lock session: the backend that holds the leader lock.
	pid := e.lockPID.Load()
	var holds bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE `+lockKeyWhere+` AND l.pid = $2)`,
		e.LockKey(), pid).Scan(&holds); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	show, ok := sessions[uint32(pid)]
	mu.Unlock()
	if !holds || !ok {
		t.Fatalf("lock pid %d holds the lock: %v; answered SHOW when it connected: %v", pid, holds, ok)
	}
	check(fmt.Sprintf("lock session (pid %d)", pid), func(name string) (string, error) { return show[name], nil })

	// The listener's session (Listen opens it with ConnectSession).
	conn, err := e.ConnectSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	check("listener session", func(name string) (got string, err error) {
		err = conn.QueryRow(ctx, "SHOW "+name).Scan(&got)
		return got, err
	})

	// The pool keeps the server defaults.
	var idle string
	if err := pool.QueryRow(ctx, "SHOW tcp_keepalives_idle").Scan(&idle); err != nil {
		t.Fatal(err)
	}
	if idle == want["tcp_keepalives_idle"] || idle == want["tcp_keepalives_idle"]+"s" {
		t.Errorf("pool connection has the session keepalives: %q", idle)
	}
}

// The leader context ends at the latest T/2 after the last answer by a
// timer of its own, even while the lead loop cannot run: here OnElected
// blocks (against its contract) so no confirmation is sent. Before the
// fix the context stayed live until OnElected returned, however long.
func TestLeaderContextEndsWithoutTheLeadLoop(t *testing.T) {
	c := pgtest.New(t)
	pool := newPool(t, c.DSN(""))
	type result struct {
		elected, ended time.Time
		cause          error
	}
	got := make(chan result, 1)
	var first atomic.Bool
	first.Store(true)
	a := startReplica(t, pool, "a", func(cfg *Config) {
		cfg.OnElected = func(l *Leadership) {
			ctx := l.Context()
			if !first.CompareAndSwap(true, false) {
				return
			}
			r := result{elected: time.Now()}
			select {
			case <-ctx.Done():
				r.cause = context.Cause(ctx)
			case <-time.After(2 * testT):
			}
			r.ended = time.Now()
			got <- r
		}
	})
	var r result
	select {
	case r = <-got:
	case <-time.After(3*testT + 20*time.Second):
		t.Fatal("not elected")
	}
	k := a.e.Keepalive()
	if r.cause == nil {
		t.Fatalf("the leader context was still live %v after the election without any confirmation; resign after %v", r.ended.Sub(r.elected), k.ResignAfter)
	}
	if el := r.ended.Sub(r.elected); el > k.ResignAfter+time.Second {
		t.Errorf("the leader context ended %v after the election, want at most T/2 = %v", el, k.ResignAfter)
	}
	t.Logf("leader context ended %v after the election: %v", r.ended.Sub(r.elected).Round(time.Millisecond), r.cause)
	testwait.Until(t, "leads again in a new term", k.FollowerRetryMax+10*time.Second, func() bool { return a.e.Term() > 1 })
	if got := testutil.ToFloat64(a.e.m.resignations.WithLabelValues(ReasonConfirmTimeout)); got != 1 {
		t.Errorf("resignations{confirm_timeout} = %v", got)
	}
}

func TestElectionFencingAndPlannedStop(t *testing.T) {
	c := pgtest.New(t)
	pool := newPool(t, c.DSN(""))
	var elected atomic.Int64
	a := startReplica(t, pool, "a", func(c *Config) {
		c.OnElected = func(l *Leadership) { elected.Store(l.Term()) }
	})
	a.waitLeads(t, "a leads", 20*time.Second)
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
		return r.inTerm(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO jobs VALUES ($1, $2)", r.lastTerm(), r.e.ID())
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
	testwait.Until(t, "registry", 10*time.Second, func() bool {
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
	b.waitLeads(t, "b leads", k.FollowerRetryMax+5*time.Second)
	if b.e.Term() <= termA {
		t.Fatalf("term did not increase: %d after %d", b.e.Term(), termA)
	}
	if err := write(b); err != nil {
		t.Fatal(err)
	}
	// A transaction fenced by the old term is rejected by the database.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return CheckTerm(ctx, tx, DefaultLockKey, termA) })
	var ste *StaleTermError
	if !errors.Is(err, ErrStaleTerm) || !errors.As(err, &ste) || ste.Term != termA || ste.Current != b.e.Term() {
		t.Fatalf("CheckTerm old term: %v", err)
	}
	if got := testutil.ToFloat64(a.e.m.resignations.WithLabelValues(ReasonStop)); got != 1 {
		t.Fatalf("resignations{stop} = %v", got)
	}
	if got := testutil.ToFloat64(a.e.m.leader); got != 0 {
		t.Fatalf("myriarch_leader after stop = %v", got)
	}
}

// countingHandler counts warnings that mention a string.
type countingHandler struct {
	slog.Handler
	match string
	n     *atomic.Int64
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn && strings.Contains(r.Message, h.match) {
		h.n.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return countingHandler{h.Handler.WithAttrs(as), h.match, h.n}
}

func (h countingHandler) WithGroup(g string) slog.Handler {
	return countingHandler{h.Handler.WithGroup(g), h.match, h.n}
}

// A server that refuses tcp_user_timeout (a proxy answers the startup
// packet the way such a server does): the sessions connect without it, the
// keepalives still apply, one warning.
func TestUserTimeoutRefusedFallsBack(t *testing.T) {
	c := pgtest.New(t)
	pool := newPool(t, c.DSN(""))
	proxy, err := pgtest.NewProxy(net.JoinHostPort(c.Host, strconv.Itoa(c.Port)), "tcp_user_timeout")
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	scfg, err := pgx.ParseConfig("postgres://postgres@" + proxy.Addr + "/postgres?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	var warnings atomic.Int64
	logger := slog.New(countingHandler{testLogger(t).Handler(), "tcp_user_timeout", &warnings})
	r := startReplica(t, pool, "a", func(c *Config) { c.SessionConfig = scfg; c.Logger = logger })
	testwait.Until(t, "leader through the refusing server", 20*time.Second, r.e.IsLeader)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 2 {
		conn, err := r.e.ConnectSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ut, idle string
		if err := conn.QueryRow(ctx, "SHOW tcp_user_timeout").Scan(&ut); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, "SHOW tcp_keepalives_idle").Scan(&idle); err != nil {
			t.Fatal(err)
		}
		conn.Close(ctx)
		if ut != "0" {
			t.Errorf("tcp_user_timeout = %q, want 0", ut)
		}
		if want := strconv.Itoa(int(r.e.Keepalive().KeepalivesIdle / time.Second)); idle != want && idle != want+"s" {
			t.Errorf("tcp_keepalives_idle = %q, want %s", idle, want)
		}
	}
	if !r.e.UserTimeoutRefused() || proxy.Refused() != 1 {
		t.Errorf("refused %v, proxy refusals %d", r.e.UserTimeoutRefused(), proxy.Refused())
	}
	if n := warnings.Load(); n != 1 {
		t.Errorf("%d warnings, want 1", n)
	}
}

// The leader's lock session ends (here: terminated by an operator): the
// leader resigns at once, campaigns again and wins a new term.
func TestLeaderResignsWhenLockSessionEnds(t *testing.T) {
	c := pgtest.New(t)
	pool := newPool(t, c.DSN(""))
	var demoted atomic.Value
	r := startReplica(t, pool, "a", func(c *Config) {
		c.OnDemoted = func(term int64, reason string) { demoted.Store(reason) }
	})
	testwait.Until(t, "leader", 20*time.Second, r.e.IsLeader)
	lctx, term, ok := r.e.leaderContext()
	if !ok {
		t.Fatal("leaderContext: not leader")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend(lock_pid) FROM "+RegistryTable+" WHERE id = 'a'"); err != nil {
		t.Fatal(err)
	}
	k := r.e.Keepalive()
	// The reason below tells a resignation on the failed confirmation
	// (session_lost) from one by the watchdog at T/2 (confirm_timeout), so
	// the waits can be generous for a loaded machine.
	testwait.Until(t, "leader context cancelled", k.ResignAfter+10*time.Second, func() bool { return lctx.Err() != nil })
	// OnDemoted runs after the context ended (jobs stop first).
	testwait.Until(t, "OnDemoted", 10*time.Second, func() bool { return demoted.Load() != nil })
	if got, _ := demoted.Load().(string); got != ReasonSessionLost {
		t.Errorf("OnDemoted reason %q", got)
	}
	testwait.Until(t, "leads again", k.FollowerRetryMax+5*time.Second, func() bool { return r.e.Term() > term })
	if got := testutil.ToFloat64(r.e.m.resignations.WithLabelValues(ReasonSessionLost)); got != 1 {
		t.Errorf("resignations{session_lost} = %v", got)
	}
	if got := testutil.ToFloat64(r.e.m.elections); got != 2 {
		t.Errorf("elections = %v", got)
	}
}

// A fenced transaction of the old term that does not finish (its process
// froze after CheckTerm) blocks the new term's increment; the new leader
// ends it, and it can never commit.
func TestNewTermEndsBlockingFencedTransaction(t *testing.T) {
	c := pgtest.New(t)
	pool := newPool(t, c.DSN(""))
	a := startReplica(t, pool, "a", nil)
	testwait.Until(t, "a leads", 20*time.Second, a.e.IsLeader)
	termA := a.e.Term()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := pool.Exec(ctx, "CREATE TABLE jobs (term bigint)"); err != nil {
		t.Fatal(err)
	}
	// The "frozen" job: its own connection, fenced, then idle in the
	// transaction.
	conn, err := pgx.Connect(ctx, c.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckTerm(ctx, tx, DefaultLockKey, termA); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO jobs VALUES ($1)", termA); err != nil {
		t.Fatal(err)
	}
	a.stop(t)
	b := startReplica(t, pool, "b", nil)
	testwait.Until(t, "b leads", 20*time.Second, b.e.IsLeader)
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("the old term's transaction committed after the new term began")
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM jobs").Scan(&n); err != nil || n != 0 {
		t.Fatalf("jobs rows %d, %v", n, err)
	}
}

func TestInTermRollsBackOnError(t *testing.T) {
	c := pgtest.New(t)
	pool := newPool(t, c.DSN(""))
	a := startReplica(t, pool, "a", nil)
	a.waitLeads(t, "a leads", 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := pool.Exec(ctx, "CREATE TABLE jobs (term bigint)"); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := a.inTerm(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO jobs VALUES (1)"); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	// Fence in a caller's own transaction.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := a.lead.Load().Fence(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO jobs VALUES (2)")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM jobs").Scan(&n); err != nil || n != 1 {
		t.Fatalf("jobs rows %d, %v", n, err)
	}
}

func TestRegistryStaleRowsAndPrune(t *testing.T) {
	c := pgtest.New(t)
	pool := newPool(t, c.DSN(""))
	a := startReplica(t, pool, "a", func(c *Config) { c.Host = "node-1"; c.Version = "v9" })
	testwait.Until(t, "a leads", 20*time.Second, a.e.IsLeader)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := pool.Exec(ctx, `INSERT INTO `+RegistryTable+` (lock_key, id, host, version, started_at, last_heartbeat, is_leader, lock_pid)
		VALUES ($1, 'gone', 'node-2', 'v8', now() - interval '1 hour', now() - interval '10 minutes', true, 12345)`, a.e.LockKey()); err != nil {
		t.Fatal(err)
	}
	rs, err := a.e.Replicas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].ID != "gone" || !rs[0].Stale || rs[0].HoldsLock || rs[0].Age < 9*time.Minute {
		t.Fatalf("stale row: %+v", rs)
	}
	if r := rs[1]; r.ID != "a" || r.Stale || !r.HoldsLock || r.Host != "node-1" || r.Version != "v9" || r.StartedAt.IsZero() {
		t.Fatalf("live row: %+v", r)
	}
	n, err := PruneReplicas(ctx, pool, a.e.LockKey(), time.Hour/2/3)
	if err != nil || n != 1 {
		t.Fatalf("prune: %d %v", n, err)
	}
}

func TestListen(t *testing.T) {
	c := pgtest.New(t)
	pool := newPool(t, c.DSN(""))
	e, err := New(Config{Pool: pool, LeaderSessionTimeout: testT, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan string, 10)
	reconnected := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- e.Listen(ctx, []string{"fleet_events"}, func(n *pgconn.Notification) { got <- n.Payload },
			func() { reconnected <- struct{}{} })
	}()
	// The session shows its LISTEN as soon as the statement starts; it
	// listens once the statement has finished (state idle). A notification
	// sent in between is lost, and the test would wait for it forever.
	listenerPID := func() (pid int32) {
		_ = pool.QueryRow(ctx, "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND state = 'idle'").Scan(&pid)
		return pid
	}
	testwait.Until(t, "listening", 20*time.Second, func() bool { return listenerPID() != 0 })
	notify := func(p string) {
		if _, err := pool.Exec(ctx, "SELECT pg_notify('fleet_events', $1)", p); err != nil {
			t.Fatal(err)
		}
	}
	receive := func(want string) {
		t.Helper()
		select {
		case p := <-got:
			if p != want {
				t.Fatalf("payload %q, want %q", p, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("notification %q not received", want)
		}
	}
	notify("one")
	receive("one")
	if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", listenerPID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-reconnected:
	case <-time.After(e.Keepalive().FollowerRetryMax + 10*time.Second):
		t.Fatal("no reconnect")
	}
	notify("two")
	receive("two")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Error("no pool accepted")
	}
	c := pgtest.New(t)
	pool := newPool(t, c.DSN(""))
	_, err := New(Config{Pool: pool, LeaderSessionTimeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "LeaderSessionTimeout: 5s") || strings.Contains(err.Error(), "ha.") {
		t.Errorf("T=5s: %v", err)
	}
	reg := prometheus.NewRegistry()
	if _, err := New(Config{Pool: pool, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Pool: pool, Registerer: reg}); err == nil {
		t.Error("metrics registered twice without error")
	}
	e, _ := New(Config{Pool: pool})
	if e.IsLeader() || e.Term() != 0 {
		t.Error("leader before Run")
	}
	if _, _, ok := e.leaderContext(); ok {
		t.Error("leaderContext ok before Run")
	}
}

// slowCancel plays a driver that honours a cancelled context only after
// delay (the default handler sets a deadline on the socket at once).
type slowCancel struct {
	conn  net.Conn
	delay time.Duration
	mu    sync.Mutex
	timer *time.Timer
}

func (h *slowCancel) HandleCancel(context.Context) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.timer = time.AfterFunc(h.delay, func() { _ = h.conn.SetDeadline(time.Now()) })
}

func (h *slowCancel) HandleUnwatchAfterCancel() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.timer != nil && h.timer.Stop() {
		_ = h.conn.SetDeadline(time.Time{})
	}
}

// The lock session's connection freezes (a proxy stops forwarding without
// FIN) and the confirmation does not time out by itself for T (a driver
// that is slow to honour its context): the watchdog on the time of the
// last answer still ends the leadership at T/2, and the follower leads
// within T.
func TestWatchdogResignsWithoutQueryTimeout(t *testing.T) {
	c := pgtest.New(t)
	pool := newPool(t, c.DSN(""))
	proxy, err := pgtest.NewProxy(net.JoinHostPort(c.Host, strconv.Itoa(c.Port)), "")
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	scfg, err := pgx.ParseConfig("postgres://postgres@" + proxy.Addr + "/postgres?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	scfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &slowCancel{conn: pc.Conn(), delay: testT}
	}
	var demotedAt atomic.Int64
	var reason atomic.Value
	e, err := New(Config{Pool: pool, SessionConfig: scfg, LeaderSessionTimeout: testT, ID: "a", Logger: testLogger(t),
		OnDemoted: func(_ int64, r string) { demotedAt.Store(time.Now().UnixNano()); reason.Store(r) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testwait.Until(t, "a leads", 20*time.Second, e.IsLeader)
	b := startReplica(t, pool, "b", nil)

	frozen := time.Now()
	proxy.Freeze()
	k := e.Keepalive()
	took := testwait.Until(t, "b leads", k.T, b.e.IsLeader)
	if demotedAt.Load() == 0 {
		t.Fatal("a was not demoted")
	}
	// The watchdog fires at T/2 after the last answer, which was sent
	// just before the freeze (right after the election); the allowance is
	// for the timer, the lead loop and OnDemoted to be scheduled on a
	// loaded machine. Without the watchdog the resignation waits for the
	// slow driver: T/3 + T.
	if got := time.Unix(0, demotedAt.Load()).Sub(frozen); got > k.ResignAfter+1500*time.Millisecond {
		t.Errorf("a resigned %v after the freeze, want at most T/2 = %v", got, k.ResignAfter)
	}
	if r, _ := reason.Load().(string); r != ReasonConfirmTimeout {
		t.Errorf("reason %q", r)
	}
	if e.IsLeader() {
		t.Error("a still reports leadership")
	}
	t.Logf("b leads %v after the freeze", took)
}

// A planned stop that arrives while a resigned leader is still ending its
// old lock session through a stuck pool (both its connections frozen)
// closes the session within ReleaseTimeout. Before, the stop waited for
// pg_terminate_backend through the pool for up to T/3 (200 s at T = 10 m).
func TestStopWhileEndingTheOldSessionIsBounded(t *testing.T) {
	c := pgtest.New(t)
	target := net.JoinHostPort(c.Host, strconv.Itoa(c.Port))
	lockProxy, err := pgtest.NewProxy(target, "")
	if err != nil {
		t.Fatal(err)
	}
	defer lockProxy.Close()
	poolProxy, err := pgtest.NewProxy(target, "")
	if err != nil {
		t.Fatal(err)
	}
	defer poolProxy.Close()
	scfg, err := pgx.ParseConfig("postgres://postgres@" + lockProxy.Addr + "/postgres?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	pool := newPool(t, "postgres://postgres@"+poolProxy.Addr+"/postgres?sslmode=disable")
	demoted := make(chan string, 4)
	a := startReplica(t, pool, "a", func(cfg *Config) {
		cfg.SessionConfig = scfg
		cfg.OnDemoted = func(_ int64, reason string) { demoted <- reason }
	})
	testwait.Until(t, "a leads", 20*time.Second, a.e.IsLeader)
	k := a.e.Keepalive()
	lockProxy.Freeze()
	poolProxy.Freeze()
	select {
	case r := <-demoted:
		if r == ReasonStop {
			t.Fatalf("demoted with reason %q", r)
		}
	case <-time.After(k.ResignAfter + 10*time.Second):
		t.Fatal("a did not resign")
	}
	// a now tries pg_terminate_backend through the frozen pool.
	stopped := time.Now()
	a.cancel()
	closed := testwait.Until(t, "lock session closed after the stop", k.ConfirmTimeout+10*time.Second,
		func() bool { return a.e.lockPID.Load() == 0 })
	if closed > stopGrace+time.Second+500*time.Millisecond {
		t.Errorf("the lock session was closed %v after the stop, want within %v", closed, stopGrace+time.Second)
	}
	if a.e.IsLeader() {
		t.Error("still reports leadership")
	}
	t.Logf("lock session closed %v after the stop (%v after the stop request)", closed.Round(time.Millisecond), time.Since(stopped).Round(time.Millisecond))
}

// A registry heartbeat through the pool carries the lock pid the replica
// knew when it sent it; one sent before the lock session registered itself
// can commit after it (the heartbeat loop starts with the campaign). Such
// a write must not erase the pid of the live lock session: the followers'
// frozen-leader check finds the leader through it. (This race made
// TestRegistryStaleRowsAndPrune flaky: HoldsLock false right after the
// election.)
func TestStaleHeartbeatKeepsTheLockPID(t *testing.T) {
	c := pgtest.New(t)
	pool := newPool(t, c.DSN(""))
	a := startReplica(t, pool, "a", func(cfg *Config) { cfg.HeartbeatInterval = time.Hour })
	testwait.Until(t, "a leads", 20*time.Second, a.e.IsLeader)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pid := a.e.lockPID.Load()
	// The late heartbeat of a replica that had no lock session yet.
	if _, err := pool.Exec(ctx, registryUpsertParam, "a", a.e.cfg.Host, "test", a.e.started, false, nil, a.e.LockKey()); err != nil {
		t.Fatal(err)
	}
	rs, err := a.e.Replicas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].LockPID != pid || !rs[0].HoldsLock {
		t.Fatalf("registry after a late heartbeat: %+v, want lock pid %d holding the lock", rs, pid)
	}
	// A pid whose backend is gone is replaced as before.
	if _, err := pool.Exec(ctx, "UPDATE "+RegistryTable+" SET lock_pid = 0 WHERE id = 'a'"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, registryUpsertParam, "a", a.e.cfg.Host, "test", a.e.started, true, pid, a.e.LockKey()); err != nil {
		t.Fatal(err)
	}
	if rs, err = a.e.Replicas(ctx); err != nil || len(rs) != 1 || rs[0].LockPID != pid {
		t.Fatalf("registry: %+v, %v", rs, err)
	}
}
