package pgleader

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
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
	// OnElected runs when this replica becomes leader, with the term's
	// Leadership: its context ends when leadership ends, and the leader
	// jobs write through its InTerm. It must not block: start the jobs in
	// goroutines that end with the context.
	OnElected func(l *Leadership)
	// OnDemoted runs after the context of term was cancelled, with one of
	// the Reason constants. It must not block.
	OnDemoted func(term int64, reason string)
	// Clock reads the time of the last answer and of the leadership checks;
	// default the system clock. Tests move it to show what a replica that
	// was paused sees when it wakes.
	Clock Clock
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

	running  atomic.Bool
	noUserTO atomic.Bool
	warnOnce sync.Once
	termLost chan int64 // fenced writes report a lost term to the lead loop
	lockPID  atomic.Int32
	clock    Clock

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
		return nil, fmt.Errorf("pgleader: Config.%w", err)
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if cfg.HeartbeatInterval < 0 {
		return nil, fmt.Errorf("pgleader: Config.HeartbeatInterval: %v: must be positive", cfg.HeartbeatInterval)
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
	if cfg.Clock == nil {
		cfg.Clock = SystemClock{}
	}
	base := cfg.SessionConfig
	ownDialer := base == nil
	if base == nil {
		base = cfg.Pool.Config().ConnConfig
	}
	e := &Elector{
		cfg:      cfg,
		k:        k,
		log:      cfg.Logger.With("component", "pgleader", "replica", cfg.ID),
		pool:     cfg.Pool,
		base:     base.Copy(),
		termLost: make(chan int64, 1),
		clock:    cfg.Clock,
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
	_, _, ok := e.leaderContext()
	return ok
}

// Term returns the term this replica leads in, 0 when it does not lead.
// Terms are stored in the database and increase with every new leader.
func (e *Elector) Term() int64 {
	_, t, _ := e.leaderContext()
	return t
}

// leaderContext returns the context of the current term (cancelled when
// leadership ends) and the term. ok is false when this replica does not
// lead; ctx is then an already cancelled context.
func (e *Elector) leaderContext() (ctx context.Context, term int64, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.leader || e.clock.Now().Sub(e.lastAnswer) >= e.k.ResignAfter || e.leaderCtx.Err() != nil {
		return cancelledCtx, 0, false
	}
	return e.leaderCtx, e.term, true
}

var cancelledCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// Run campaigns and leads until ctx ends, then releases the lock (planned
// stop, within ReleaseTimeout) and returns nil. It returns an error only for
// misuse (Run called twice). Database errors are logged and retried.
func (e *Elector) Run(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return errors.New("pgleader: Run called twice")
	}
	e.started = time.Now() // shown to operators: wall time
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
