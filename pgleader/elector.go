package pgleader

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/myriarch/myriarch/failover"
)

// Defaults.
const (
	DefaultLockKey           int64 = 7012024
	DefaultHeartbeatInterval       = 10 * time.Second
	// ReleaseTimeout bounds the unlock and close of the lock session on a
	// planned stop.
	ReleaseTimeout = 4 * time.Second
	// ListenerCloseTimeout bounds the close of a listener session (Listen)
	// after its context ended. ReleaseTimeout + ListenerCloseTimeout is
	// failover.LeaderReleaseBound, the leader's share of the shutdown
	// sizing (a test holds them together).
	ListenerCloseTimeout = time.Second
)

// Reasons of a resignation (label "reason" of
// myriarch_leader_resignations_total and the argument of OnDemoted).
const (
	// ReasonConfirmTimeout: no answer on the lock session within T/2.
	ReasonConfirmTimeout = "confirm_timeout"
	// ReasonSessionLost: the lock session failed (closed, terminated).
	ReasonSessionLost = "session_lost"
	// ReasonTermLost: a fenced write found that the term is no longer current.
	ReasonTermLost = "term_lost"
	// ReasonStop: planned stop.
	ReasonStop = "stop"
)

// ErrStaleTerm matches (errors.Is) every *StaleTermError: fenced writes
// return one when this replica is not the leader or its term is no longer
// the current one.
var ErrStaleTerm = errors.New("pgleader: stale term")

// StaleTermError is the typed error of a rejected fenced write.
type StaleTermError struct {
	// Term is the term the write was fenced with (0: the replica did not
	// lead). Current is the current term in the database when it was read
	// (0: not read).
	Term, Current int64
	// Reason says why, e.g. "newer term", "lock no longer held".
	Reason string
	// Err is an underlying error (the end of leadership interrupted the
	// transaction), if any.
	Err error
}

func (e *StaleTermError) Error() string {
	msg := fmt.Sprintf("pgleader: stale term %d: %s", e.Term, e.Reason)
	if e.Current != 0 {
		msg += fmt.Sprintf(" (current term %d)", e.Current)
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is makes errors.Is(err, ErrStaleTerm) true.
func (e *StaleTermError) Is(target error) bool { return target == ErrStaleTerm }

// Unwrap returns the underlying error.
func (e *StaleTermError) Unwrap() error { return e.Err }

// Config configures an Elector. Only Pool is required.
type Config struct {
	// Pool is the regular pool: registry, term reads, fenced writes and
	// pg_terminate_backend run through it. Its connections keep the
	// server's TCP defaults.
	Pool *pgxpool.Pool
	// SessionConfig is the base configuration of the dedicated lock and
	// listener sessions; default a copy of Pool's connection config, dialed
	// with client-side TCP keepalives like the server's. The keepalive
	// parameters are added to its RuntimeParams. A SessionConfig given here
	// keeps its own DialFunc.
	SessionConfig *pgx.ConnConfig
	// LeaderSessionTimeout is T (ha.leaderSessionTimeout), within [10s, 10m];
	// default 30s.
	LeaderSessionTimeout time.Duration
	// HeartbeatInterval is the registry heartbeat (ha.heartbeatInterval);
	// default 10s.
	HeartbeatInterval time.Duration
	// LockKey is the advisory lock key (ha.leaderLockKey); default 7012024.
	// Zero means the default.
	LockKey int64
	// ID identifies the replica in the registry; default
	// <hostname>-<pid>-<random>. Host and Version are reported as given
	// (Host defaults to the hostname).
	ID, Host, Version string
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
	// OnElected runs when this replica becomes leader, with the leader
	// context of the term (cancelled when leadership ends). It must not
	// block: start the leader jobs in goroutines that end with ctx.
	OnElected func(ctx context.Context, term int64)
	// OnDemoted runs after the leader context of term was cancelled, with
	// one of the Reason constants. It must not block.
	OnDemoted func(term int64, reason string)
}

// Elector runs the election loop of one replica.
type Elector struct {
	cfg     Config
	k       failover.LeaderKeepalive
	log     *slog.Logger
	pool    *pgxpool.Pool
	base    *pgx.ConnConfig
	started time.Time
	m       *metrics

	running   atomic.Bool
	noUserTO  atomic.Bool
	warnOnce  sync.Once
	termLost  chan int64 // fenced writes report a lost term to the lead loop
	lockPID   atomic.Int32
	lastTerm  atomic.Int64
	electedCh chan struct{} // closed and replaced on every election
	// confirmTimeout is the timeout of one confirmation, T/3; tests raise
	// it to show that the watchdog alone ends the leadership.
	confirmTimeout time.Duration
	// probe, nil outside tests, runs a function on the lock session from
	// the lead loop while no confirmation is in flight (the connection is
	// not safe for concurrent use).
	probe chan func(*pgx.Conn)

	mu         sync.Mutex
	leader     bool
	term       int64
	leaderCtx  context.Context
	lastAnswer time.Time // send time of the last answered confirmation
}

// New validates cfg and returns an Elector. It does not touch the database.
func New(cfg Config) (*Elector, error) {
	if cfg.Pool == nil {
		return nil, errors.New("pgleader: Config.Pool is required")
	}
	if cfg.LeaderSessionTimeout == 0 {
		cfg.LeaderSessionTimeout = failover.DefaultLeaderSessionTimeout
	}
	k, err := failover.DeriveLeaderKeepalive(cfg.LeaderSessionTimeout)
	if err != nil {
		return nil, err
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if cfg.HeartbeatInterval < 0 {
		return nil, fmt.Errorf("pgleader: ha.heartbeatInterval %v: must be positive", cfg.HeartbeatInterval)
	}
	if cfg.LockKey == 0 {
		cfg.LockKey = DefaultLockKey
	}
	host, _ := os.Hostname()
	if cfg.Host == "" {
		cfg.Host = host
	}
	if cfg.ID == "" {
		var b [4]byte
		_, _ = crand.Read(b[:])
		cfg.ID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	base := cfg.SessionConfig
	ownDialer := base == nil
	if base == nil {
		base = cfg.Pool.Config().ConnConfig
	}
	e := &Elector{
		cfg:       cfg,
		k:         k,
		log:       cfg.Logger.With("component", "pgleader", "replica", cfg.ID),
		pool:      cfg.Pool,
		base:      base.Copy(),
		termLost:  make(chan int64, 1),
		electedCh: make(chan struct{}),

		confirmTimeout: k.ConfirmTimeout,
	}
	if ownDialer {
		// The client side of the dedicated sessions notices a silent server
		// too (the listener would otherwise wait for hours): keepalives like
		// the server's, giving up after about D.
		d := &net.Dialer{Timeout: k.ConfirmTimeout, KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: k.KeepalivesIdle, Interval: k.KeepalivesInterval, Count: k.KeepalivesCount + 1}}
		e.base.DialFunc = d.DialContext
	}
	if e.m, err = newMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	return e, nil
}

// Keepalive returns the parameters derived from T.
func (e *Elector) Keepalive() failover.LeaderKeepalive { return e.k }

// ID is the replica id in the registry.
func (e *Elector) ID() string { return e.cfg.ID }

// LockKey is the advisory lock key.
func (e *Elector) LockKey() int64 { return e.cfg.LockKey }

// IsLeader reports whether this replica leads right now: it holds the lock
// and its last confirmation was answered less than T/2 ago (checked against
// the clock, so a process that was paused reports false at once on waking).
func (e *Elector) IsLeader() bool {
	_, _, ok := e.LeaderContext()
	return ok
}

// Term returns the term this replica leads in, 0 when it does not lead.
// Terms are stored in the database and increase with every new leader.
func (e *Elector) Term() int64 {
	_, t, _ := e.LeaderContext()
	return t
}

// LastTerm returns the last term this replica led in (0: never), also after
// it lost leadership.
func (e *Elector) LastTerm() int64 { return e.lastTerm.Load() }

// LeaderContext returns the context of the current term (cancelled when
// leadership ends) and the term. ok is false when this replica does not
// lead; ctx is then an already cancelled context.
func (e *Elector) LeaderContext() (ctx context.Context, term int64, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.leader || time.Since(e.lastAnswer) >= e.k.ResignAfter || e.leaderCtx.Err() != nil {
		return cancelledCtx, 0, false
	}
	return e.leaderCtx, e.term, true
}

// WaitLeader blocks until this replica leads or ctx ends, and returns the
// leader context and term.
func (e *Elector) WaitLeader(ctx context.Context) (context.Context, int64, error) {
	for {
		e.mu.Lock()
		ch := e.electedCh
		e.mu.Unlock()
		if lctx, term, ok := e.LeaderContext(); ok {
			return lctx, term, nil
		}
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-ch:
		}
	}
}

var cancelledCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// InTerm runs fn in a transaction on the pool that is fenced by the current
// term: it first runs CheckTerm (locking the term row FOR SHARE), so fn's
// writes commit only while this replica's term is current and no new term
// can start until the transaction ends. fn's context is cancelled when
// leadership ends. Without leadership, or when the term is no longer
// current, InTerm returns a *StaleTermError (errors.Is(err, ErrStaleTerm))
// and fn does not run (or its transaction rolls back). The transaction ends itself when idle
// for longer than T/2.
func (e *Elector) InTerm(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	lctx, term, ok := e.LeaderContext()
	if !ok {
		return &StaleTermError{Reason: "replica " + e.cfg.ID + " does not lead"}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(lctx, cancel)
	defer stop()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return e.fencedErr(lctx, term, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL idle_in_transaction_session_timeout = %d", e.k.ResignAfter.Milliseconds())); err != nil {
		return e.fencedErr(lctx, term, err)
	}
	if err := e.fence(ctx, tx, term); err != nil {
		return e.fencedErr(lctx, term, err)
	}
	if err := fn(ctx, tx); err != nil {
		return e.fencedErr(lctx, term, err)
	}
	return e.fencedErr(lctx, term, tx.Commit(ctx))
}

// fencedErr turns a failure caused by the end of leadership into ErrStaleTerm.
func (e *Elector) fencedErr(lctx context.Context, term int64, err error) error {
	if err == nil || errors.Is(err, ErrStaleTerm) {
		return err
	}
	if lctx.Err() != nil {
		return &StaleTermError{Term: term, Reason: "leadership ended", Err: err}
	}
	return err
}

// Fence checks, inside a transaction of the caller on any connection of the
// database, that this replica's term is still current (see CheckTerm). Use
// it as the first statement of a leader job's own transaction.
func (e *Elector) Fence(ctx context.Context, tx pgx.Tx) error {
	_, term, ok := e.LeaderContext()
	if !ok {
		return &StaleTermError{Reason: "replica " + e.cfg.ID + " does not lead"}
	}
	return e.fence(ctx, tx, term)
}

func (e *Elector) fence(ctx context.Context, tx pgx.Tx, term int64) error {
	err := CheckTerm(ctx, tx, e.cfg.LockKey, term)
	if errors.Is(err, ErrStaleTerm) {
		select {
		case e.termLost <- term:
		default:
		}
	}
	return err
}

// Replicas lists the registry; rows whose heartbeat is older than three
// heartbeat intervals are marked Stale.
func (e *Elector) Replicas(ctx context.Context) ([]Replica, error) {
	return ReadReplicas(ctx, e.pool, e.cfg.LockKey, 3*e.cfg.HeartbeatInterval)
}

// ConnectSession opens a dedicated session with the keepalive parameters in
// the startup packet, like the lock session. Use it for the LISTEN/NOTIFY
// listener. The caller closes it.
func (e *Elector) ConnectSession(ctx context.Context) (*pgx.Conn, error) {
	if !e.noUserTO.Load() {
		conn, err := pgx.ConnectConfig(ctx, e.sessionConfig(true))
		if err == nil || !isUserTimeoutRefusal(err) {
			return conn, err
		}
		e.noUserTO.Store(true)
		e.warnOnce.Do(func() {
			e.log.Warn("PostgreSQL refuses tcp_user_timeout; the lock and listener sessions use the keepalive settings without it", "error", err)
		})
	}
	return pgx.ConnectConfig(ctx, e.sessionConfig(false))
}

// UserTimeoutRefused reports whether the server refused tcp_user_timeout.
func (e *Elector) UserTimeoutRefused() bool { return e.noUserTO.Load() }

func (e *Elector) sessionConfig(withUserTimeout bool) *pgx.ConnConfig {
	c := e.base.Copy()
	if c.RuntimeParams == nil {
		c.RuntimeParams = map[string]string{}
	}
	for k, v := range e.k.RuntimeParams(withUserTimeout) {
		c.RuntimeParams[k] = v
	}
	if c.RuntimeParams["application_name"] == "" {
		c.RuntimeParams["application_name"] = "myriarch-pgleader"
	}
	return c
}

// Run campaigns and leads until ctx ends, then releases the lock (planned
// stop, within ReleaseTimeout) and returns nil. It returns an error only for
// misuse (Run called twice). Database errors are logged and retried.
func (e *Elector) Run(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return errors.New("pgleader: Run called twice")
	}
	e.started = time.Now()
	for {
		sctx, cancel := context.WithTimeout(ctx, e.k.ConfirmTimeout)
		err := EnsureSchema(sctx, e.pool)
		cancel()
		if err == nil {
			break
		}
		e.log.Warn("creating the leader tables failed; retrying", "error", err)
		if !sleepCtx(ctx, e.retryDelay()) {
			return nil
		}
	}
	var wg sync.WaitGroup
	hbCtx, hbStop := context.WithCancel(context.WithoutCancel(ctx))
	wg.Go(func() { e.heartbeatLoop(hbCtx) })
	defer func() {
		hbStop()
		wg.Wait()
		fctx, fcancel := context.WithTimeout(context.Background(), time.Second)
		e.writeRegistry(fctx, false, true)
		fcancel()
	}()

	var s *session
	defer func() {
		if s != nil {
			s.hardClose()
			e.lockPID.Store(0)
		}
	}()
	for {
		var term int64
		s, term = e.campaign(ctx, s)
		if s == nil {
			return nil
		}
		stopped := e.lead(ctx, s, term)
		s = nil
		if stopped {
			return nil
		}
	}
}

func (e *Elector) retryDelay() time.Duration {
	r := e.k.FollowerRetry
	return r + rand.N(e.k.FollowerRetryMax-r+1)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// session is the dedicated lock session.
type session struct {
	conn *pgx.Conn
	pid  uint32
}

// closeSocket closes the socket under the driver (safe while a query runs).
func (s *session) closeSocket() {
	if c := s.conn.PgConn().Conn(); c != nil {
		_ = c.Close()
	}
}

// hardClose closes the socket without waiting for the server; the server
// sees a FIN (or nothing when the network is gone) and releases the lock.
func (s *session) hardClose() {
	s.closeSocket()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_ = s.conn.Close(ctx)
}

func (e *Elector) connectLock(ctx context.Context) (*session, error) {
	cctx, cancel := context.WithTimeout(ctx, e.k.ConfirmTimeout)
	defer cancel()
	conn, err := e.ConnectSession(cctx)
	if err != nil {
		return nil, err
	}
	s := &session{conn: conn, pid: conn.PgConn().PID()}
	// Register the lock session's pid, so that followers can tell the
	// heartbeat of a lock holder.
	if _, err := conn.Exec(cctx, registryUpsertSelf, e.cfg.ID, e.cfg.Host, e.cfg.Version, e.started, false); err != nil {
		s.hardClose()
		return nil, err
	}
	e.lockPID.Store(int32(s.pid))
	return s, nil
}

// campaign tries the lock until it gets it (returns the session and the new
// term) or ctx ends (returns nil after closing the session).
//
// Fast path: between tries the follower waits on the lock itself (a
// blocking pg_advisory_lock bounded by lock_timeout = the jittered retry),
// so the server hands it the lock the moment the holder unlocks or its
// session ends, whatever the cause (planned stop, kill -9, crash, a session
// the server dropped by its keepalives). When a wait runs out, the
// frozen-leader check runs as before; the retry interval is therefore
// still the longest time between two checks, and every bound holds as an
// upper bound.
func (e *Elector) campaign(ctx context.Context, s *session) (*session, int64) {
	wait := time.Duration(0) // the first try does not wait
	for {
		if ctx.Err() != nil {
			if s != nil {
				s.hardClose()
				e.lockPID.Store(0)
			}
			return nil, 0
		}
		if s == nil {
			var err error
			if s, err = e.connectLock(ctx); err != nil {
				if ctx.Err() == nil {
					e.log.Warn("opening the lock session failed", "error", err)
				}
				sleepCtx(ctx, e.retryDelay())
				continue
			}
		}
		got, err := e.tryLock(ctx, s, wait)
		if err != nil {
			if ctx.Err() == nil {
				e.log.Warn("lock attempt failed", "error", err)
			}
			s.hardClose()
			s = nil
			e.lockPID.Store(0)
			sleepCtx(ctx, e.retryDelay())
			wait = 0
			continue
		}
		if got {
			term, err := e.startTerm(ctx, s)
			if err != nil {
				e.log.Warn("starting a term failed; giving the lock back", "error", err)
				s.hardClose()
				s = nil
				e.lockPID.Store(0)
				sleepCtx(ctx, e.retryDelay())
				wait = 0
				continue
			}
			return s, term
		}
		wait = e.retryDelay()
		if e.endStaleLeader(ctx) {
			// The frozen leader's session was ended: its lock is free as
			// soon as the backend has exited; the next wait takes it.
			e.log.Info("waiting for the lock of the ended session")
		}
	}
}

// tryLock takes the lock on the lock session. With wait 0 it only tries;
// otherwise it waits up to wait for the lock and reports false when the
// wait ran out. The wait is bounded by the server (lock_timeout, set for
// this one statement: the implicit transaction of the multi-statement
// query rolls the setting back when the wait fails, and the last
// statement resets it when it succeeds), so the session stays usable and
// no cancel request is needed.
func (e *Elector) tryLock(ctx context.Context, s *session, wait time.Duration) (bool, error) {
	qctx, cancel := context.WithTimeout(ctx, wait+e.k.ConfirmTimeout)
	defer cancel()
	if wait <= 0 {
		var got bool
		err := s.conn.QueryRow(qctx, "SELECT pg_try_advisory_lock($1)", e.cfg.LockKey).Scan(&got)
		return got, err
	}
	_, err := s.conn.Exec(qctx, fmt.Sprintf("SET lock_timeout = %d; SELECT pg_advisory_lock(%d); SET lock_timeout = 0",
		max(1, wait.Milliseconds()), e.cfg.LockKey))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, nil
}

// startTerm increments the term on the lock session. Fenced transactions of
// the old term hold the term row FOR SHARE; the increment waits for them,
// and ends those that do not finish promptly (a frozen old leader's).
func (e *Elector) startTerm(ctx context.Context, s *session) (int64, error) {
	qctx, cancel := context.WithTimeout(ctx, e.k.ConfirmTimeout)
	defer cancel()
	sent := time.Now()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { e.endBlockers(qctx, s.pid, done) })
	var term int64
	err := s.conn.QueryRow(qctx, `INSERT INTO `+TermTable+` AS t (lock_key, term, leader_id, lock_pid, elected_at)
		VALUES ($1, 1, $2, pg_backend_pid(), now())
		ON CONFLICT (lock_key) DO UPDATE SET term = t.term + 1, leader_id = EXCLUDED.leader_id,
			lock_pid = EXCLUDED.lock_pid, elected_at = EXCLUDED.elected_at
		RETURNING term`, e.cfg.LockKey, e.cfg.ID).Scan(&term)
	close(done)
	wg.Wait()
	if err != nil {
		return 0, err
	}
	if _, err := s.conn.Exec(qctx, confirmSQL, e.cfg.ID, true); err != nil {
		return 0, err
	}
	e.mu.Lock()
	e.lastAnswer = sent
	e.mu.Unlock()
	return term, nil
}

// stopGrace is how long a planned stop waits for the end of an old lock
// session through the pool before it closes the session's socket.
const stopGrace = time.Second

// blockerGrace is how long a new leader waits for fenced transactions of
// the old term before it ends them.
const blockerGrace = 300 * time.Millisecond

func (e *Elector) endBlockers(ctx context.Context, pid uint32, done <-chan struct{}) {
	t := time.NewTicker(blockerGrace)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rows, err := e.pool.Query(ctx, "SELECT b, pg_terminate_backend(b) FROM unnest(pg_blocking_pids($1)) AS b", int32(pid))
		if err != nil {
			continue
		}
		for rows.Next() {
			var b int32
			var ok bool
			if rows.Scan(&b, &ok) == nil && ok {
				e.log.Warn("ended a transaction of the old term that blocked the new term", "pid", b)
			}
		}
		rows.Close()
	}
}

// endStaleLeader ends the lock session of a leader whose registry heartbeat
// (or, if newer, the last activity of its lock session) is older than T. It
// reports whether it ended one.
func (e *Elector) endStaleLeader(ctx context.Context) bool {
	qctx, cancel := context.WithTimeout(ctx, e.k.ConfirmTimeout)
	defer cancel()
	var pid int32
	var id string
	var age float64
	err := e.pool.QueryRow(qctx, `SELECT l.pid, r.id,
			EXTRACT(EPOCH FROM now() - greatest(r.last_heartbeat, a.state_change))::float8
		FROM pg_locks l
		JOIN `+RegistryTable+` r ON r.lock_pid = l.pid
		LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE `+lockKeyWhere+`
		ORDER BY 3 LIMIT 1`, e.cfg.LockKey).Scan(&pid, &id, &age)
	if err != nil {
		if !errors.Is(err, pgx.ErrNoRows) && ctx.Err() == nil {
			e.log.Debug("reading the leader's heartbeat failed", "error", err)
		}
		return false
	}
	if time.Duration(age*float64(time.Second)) <= e.k.T {
		return false
	}
	var ended bool
	err = e.pool.QueryRow(qctx, "SELECT pg_terminate_backend($1, $2)", pid, max(int64(1), e.k.AcquisitionMargin.Milliseconds())).Scan(&ended)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42883" {
		// Before PostgreSQL 14 pg_terminate_backend has no timeout.
		err = e.pool.QueryRow(qctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ended)
	}
	if err != nil {
		e.log.Warn("ending the lock session of a stale leader failed", "leader", id, "pid", pid, "error", err)
		return false
	}
	e.log.Warn("ended the lock session of a leader whose heartbeat is stale", "leader", id, "pid", pid, "heartbeat_age_s", age, "ended", ended)
	e.m.staleEnded.Inc()
	return true
}

var (
	errConfirmTimeout = errors.New("pgleader: leadership ended: no confirmation of the lock session answered for T/2")
	errResigned       = errors.New("pgleader: leadership ended")
)

type confirmResult struct {
	sent time.Time
	err  error
}

// lead runs one term. It returns true after a planned stop (ctx ended) and
// false after a resignation.
func (e *Elector) lead(ctx context.Context, s *session, term int64) (stopped bool) {
	lctx, lcancel := context.WithCancelCause(context.Background())
	// The watchdog ends the leader context at the latest T/2 after the last
	// answer by a timer of its own, so that nothing the lead loop waits for
	// (OnElected, a goroutine scheduled late after a pause) can keep the
	// context of the jobs alive past that point. The loop only moves the
	// time of the last answer forward, under e.mu, and resigns once it sees
	// the context ended.
	var watchdog *time.Timer
	expire := func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if lctx.Err() != nil {
			return
		}
		if left := time.Until(e.lastAnswer.Add(e.k.ResignAfter)); left > 0 {
			watchdog.Reset(left)
			return
		}
		lcancel(errConfirmTimeout)
	}
	e.mu.Lock()
	e.leader, e.term, e.leaderCtx = true, term, lctx
	close(e.electedCh)
	e.electedCh = make(chan struct{})
	watchdog = time.AfterFunc(time.Until(e.lastAnswer.Add(e.k.ResignAfter)), expire)
	e.mu.Unlock()
	defer watchdog.Stop()
	e.lastTerm.Store(term)
	e.m.leader.Set(1)
	e.m.term.Set(float64(term))
	e.m.elections.Inc()
	e.log.Info("elected leader", "term", term, "lock_pid", s.pid)
	if e.cfg.OnElected != nil {
		e.cfg.OnElected(lctx, term)
	}
	// Drain a stale report of an earlier term.
	select {
	case <-e.termLost:
	default:
	}

	confirmCtx, confirmStop := context.WithCancel(context.Background())
	defer confirmStop()
	results := make(chan confirmResult, 1)
	inflight := false
	ticker := time.NewTicker(e.k.ConfirmInterval)
	defer ticker.Stop()
	reason := ""
loop:
	for {
		probe := e.probe
		if inflight {
			probe = nil
		}
		select {
		case <-ctx.Done():
			reason = ReasonStop
			break loop
		case <-lctx.Done():
			reason = ReasonConfirmTimeout
			break loop
		case p := <-probe:
			p(s.conn)
		case t := <-e.termLost:
			if t == term {
				reason = ReasonTermLost
				break loop
			}
		case <-ticker.C:
			if !inflight {
				inflight = true
				go func() { results <- e.confirm(confirmCtx, s) }()
			}
		case r := <-results:
			inflight = false
			if r.err != nil {
				reason = ReasonSessionLost
				if errors.Is(r.err, context.DeadlineExceeded) {
					reason = ReasonConfirmTimeout
				}
				e.log.Warn("confirming the lock session failed", "term", term, "error", r.err)
				break loop
			}
			e.mu.Lock()
			expired := lctx.Err() != nil
			if !expired {
				e.lastAnswer = r.sent
				watchdog.Reset(time.Until(r.sent.Add(e.k.ResignAfter)))
			}
			e.mu.Unlock()
			if expired {
				reason = ReasonConfirmTimeout
				break loop
			}
		}
	}

	// Give up leadership first: jobs stop before anything else happens.
	e.mu.Lock()
	e.leader = false
	e.mu.Unlock()
	lcancel(errResigned)
	e.m.leader.Set(0)
	e.m.resignations.WithLabelValues(reason).Inc()
	if reason == ReasonStop {
		e.log.Info("leader stopping", "term", term)
	} else {
		e.log.Warn("resigned leadership", "term", term, "reason", reason)
	}
	if e.cfg.OnDemoted != nil {
		e.cfg.OnDemoted(term, reason)
	}

	if reason == ReasonStop {
		e.release(s, confirmStop, inflight, results)
		return true
	}
	// End the lock session through a regular connection: this frees the
	// lock at once when only the lock connection is affected.
	// A planned stop that arrives meanwhile cuts the call short after
	// stopGrace, so that the stop still closes the session within
	// ReleaseTimeout (the call alone may take T/3 when the pool is stuck).
	tctx, tcancel := context.WithTimeout(context.Background(), e.k.ConfirmTimeout)
	onStop := context.AfterFunc(ctx, func() { time.AfterFunc(stopGrace, tcancel) })
	if _, err := e.pool.Exec(tctx, "SELECT pg_terminate_backend($1)", int32(s.pid)); err != nil {
		e.log.Warn("ending the old lock session failed; the server drops it by its keepalives", "pid", s.pid, "error", err)
	}
	onStop()
	tcancel()
	confirmStop()
	if inflight {
		s.awaitConfirm(results)
	}
	s.hardClose()
	e.lockPID.Store(0)
	return ctx.Err() != nil
}

// awaitConfirm waits for the confirmation in flight after its context was
// cancelled. Should the driver not return within a second (the watchdog
// exists for drivers that hang), the socket is closed under it.
func (s *session) awaitConfirm(results <-chan confirmResult) {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-results:
	case <-t.C:
		s.closeSocket()
		<-results
	}
}

// confirmSQL refreshes the leader's registry heartbeat through the lock
// session. It never waits for a row lock (SKIP LOCKED): a row locked by
// someone else is left alone, and the answer still confirms the session.
const confirmSQL = `WITH r AS (SELECT id FROM ` + RegistryTable + ` WHERE id = $1 FOR UPDATE SKIP LOCKED)
	UPDATE ` + RegistryTable + ` t SET last_heartbeat = now(), is_leader = $2, lock_pid = CASE WHEN $2 THEN pg_backend_pid() END
	FROM r WHERE t.id = r.id`

func (e *Elector) confirm(ctx context.Context, s *session) confirmResult {
	sent := time.Now()
	qctx, cancel := context.WithTimeout(ctx, e.confirmTimeout)
	defer cancel()
	_, err := s.conn.Exec(qctx, confirmSQL, e.cfg.ID, true)
	return confirmResult{sent: sent, err: err}
}

// release unlocks and closes the lock session within ReleaseTimeout.
func (e *Elector) release(s *session, confirmStop context.CancelFunc, inflight bool, results <-chan confirmResult) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), ReleaseTimeout-500*time.Millisecond)
	defer cancel()
	if inflight {
		t := time.NewTimer(min(e.k.ConfirmTimeout/4, time.Second))
		select {
		case <-results:
		case <-t.C:
			confirmStop()
			s.awaitConfirm(results)
		}
		t.Stop()
	}
	defer e.lockPID.Store(0)
	if _, err := s.conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", e.cfg.LockKey); err != nil {
		e.log.Warn("unlocking failed; closing the session", "error", err)
		s.hardClose()
		return
	}
	_, _ = s.conn.Exec(ctx, confirmSQL, e.cfg.ID, false)
	if err := s.conn.Close(ctx); err != nil {
		s.hardClose()
	}
	e.log.Info("released leadership", "took", time.Since(start))
}

func (e *Elector) heartbeatLoop(ctx context.Context) {
	e.writeRegistry(ctx, e.IsLeader(), false)
	t := time.NewTicker(e.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			e.writeRegistry(ctx, e.IsLeader(), false)
		}
	}
}

// writeRegistry upserts this replica's row through the pool.
func (e *Elector) writeRegistry(ctx context.Context, leader, final bool) {
	ctx, cancel := context.WithTimeout(ctx, e.k.ConfirmTimeout)
	defer cancel()
	var pid any
	if p := e.lockPID.Load(); p != 0 && !final {
		pid = p
	}
	if _, err := e.pool.Exec(ctx, registryUpsertParam, e.cfg.ID, e.cfg.Host, e.cfg.Version, e.started, leader, pid); err != nil && ctx.Err() == nil {
		e.log.Warn("registry heartbeat failed", "error", err)
	}
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}
