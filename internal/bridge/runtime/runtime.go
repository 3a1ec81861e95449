// Package runtime runs a validated bridge configuration: it opens the
// senders and the lease store, runs every session — exclusive ones under a
// lease manager, connecting only while they hold the lease — and exposes
// what /ready and /status report.
//
// An exclusive session connects to its broker only after the lease is
// acquired and disconnects when it is lost; the next tenure gets a fresh
// transport session in the same process. The one exception is a
// broker-path step-down: it is terminal, Run returns
// lease.ErrDependencyStepDown and the process exits non-zero, because an
// owner that proved it cannot reach the broker would otherwise re-seize
// the lease it just released before a standby's next poll. The
// orchestrator restarts it and it rejoins as a standby.
package runtime

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/myriarch/myriarch/internal/bridge/budget"
	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/metrics"
	"github.com/myriarch/myriarch/internal/bridge/mqttconn"
	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/spool"
	"github.com/myriarch/myriarch/internal/bridge/transport"
	"github.com/myriarch/myriarch/internal/bridge/transport/mqtt"
	"github.com/myriarch/myriarch/internal/bridge/transport/mqtt311"
	"github.com/myriarch/myriarch/lease"
)

var randRead = rand.Read

// Bridge is a running bridge.
type Bridge struct {
	cfg        *config.Config
	log        *slog.Logger
	reg        prometheus.Registerer
	met        *metrics.Bridge
	instanceID string
	senders    map[string]sender.Sender
	dl         *routing.DeadLetter
	store      lease.Store
	onEvent    func(session string, e lease.Event)
	clock      lease.Clock

	// mu guards cfg, senders and runners, which a reload replaces, and the
	// run state below.
	mu      sync.Mutex
	runners []*runner
	// Set by Run: the context every runner derives from, the hard stop
	// shutdown_timeout after it ends, and the runners' owner.
	runCtx    context.Context
	hard      context.Context
	cancelRun context.CancelFunc
	stopped   bool // Run is returning: no runner may start
	wg        sync.WaitGroup
	firstErr  error
	// reloadMu serializes reloads.
	reloadMu sync.Mutex
}

// Options are what the process adds to the configuration.
type Options struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer // nil: metrics are not registered
	// Clock is the clock of the owners' lease deadlines; nil is the
	// default (CLOCK_BOOTTIME on Linux). Tests jump it to freeze an owner
	// through its deadline (lease.JumpClock).
	Clock lease.Clock
	// OnLeaseEvent, if set, receives every lease event of every exclusive
	// session (config session id and the event), in order per session,
	// from the goroutine that consumes the manager's events; it must not
	// block. Tests and the lab read ownership intervals from it.
	OnLeaseEvent func(session string, e lease.Event)
}

// New opens the senders and the lease store. Nothing connects to a source
// broker before Run.
func New(ctx context.Context, cfg *config.Config, opts Options) (*Bridge, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	b := &Bridge{cfg: cfg, log: log, reg: opts.Registerer, met: metrics.New(opts.Registerer), instanceID: cfg.Bridge.InstanceID,
		onEvent: opts.OnLeaseEvent, clock: opts.Clock}
	if b.instanceID == "" {
		b.instanceID = defaultInstanceID()
	}
	b.log = b.log.With("bridge", cfg.Bridge.ID, "instance", b.instanceID)
	if len(cfg.Exclusive) > 0 {
		st, err := openStore(ctx, cfg.LeaseStore)
		if err != nil {
			return nil, fmt.Errorf("lease store (%s): %w", cfg.LeaseStore.Type, err)
		}
		b.store = st
	}
	senders, err := openSenders(ctx, cfg, b.instanceID, b.log)
	if err != nil {
		b.closeStore()
		return nil, err
	}
	b.senders = senders
	b.dl = routing.OpenDeadLetter(cfg.Bridge.DeadLetterPath)
	for i := range cfg.Sessions {
		r, err := b.newRunner(cfg, &cfg.Sessions[i])
		if err != nil {
			b.closeAll(ctx)
			return nil, err
		}
		b.runners = append(b.runners, r)
	}
	return b, nil
}

func (b *Bridge) closeStore() {
	if b.store != nil {
		_ = b.store.Close()
	}
}

func (b *Bridge) closeAll(ctx context.Context) {
	for id, s := range b.senders {
		if err := s.Close(ctx); err != nil {
			b.log.Warn("closing sender", "sender", id, "err", err)
		}
	}
	_ = b.dl.Close()
	b.closeStore()
}

// InstanceID is this process's instance id.
func (b *Bridge) InstanceID() string { return b.instanceID }

// LogBudgets logs, per exclusive session, the numbers `check` discloses.
func (b *Bridge) LogBudgets() {
	for _, c := range b.cfg.Exclusive {
		r := budget.NewBridgeReport(b.cfg.Bridge.DeploymentMode, c.Assessment)
		attrs := []any{"session", c.SessionID, "lease_ttl", c.Assessment.Cadence.LeaseTTL,
			"renew_interval", c.Assessment.Cadence.RenewInterval, "acquire_poll_interval", c.Assessment.Cadence.AcquirePollInterval,
			"activation", c.Assessment.Policy.Activation.Bound, "broker_health_step_down", c.Assessment.Policy.BrokerHealthStepDown.String(),
			"broker_path_failover", r.BrokerPathFailover}
		if c.Assessment.OwnerDeath != nil {
			attrs = append(attrs, "worst_case_failover_budget", c.Assessment.OwnerDeath.Total)
		}
		if c.Assessment.BrokerPath != nil {
			attrs = append(attrs, "broker_path_budget", c.Assessment.BrokerPath.Total)
		}
		if slo := c.Assessment.Policy.FailoverSLO; slo > 0 {
			attrs = append(attrs, "failover_slo", slo)
		}
		b.log.Info("failover budget", attrs...)
	}
}

// Run runs every session until ctx ends, then shuts down gracefully
// within shutdown_timeout: intake stops, in-flight messages drain, leases
// are released. It returns lease.ErrDependencyStepDown after a broker-path
// step-down (after shutting the rest down), or the first fatal error.
func (b *Bridge) Run(ctx context.Context) error {
	defer b.closeAll(context.Background())
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	// hard ends everything shutdown_timeout after the graceful stop began.
	hard, cancelHard := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHard()
	stopTimer := context.AfterFunc(runCtx, func() {
		time.AfterFunc(b.shutdownTimeout(), cancelHard)
	})
	defer stopTimer()

	b.mu.Lock()
	if b.runCtx != nil {
		b.mu.Unlock()
		return errors.New("bridge: Run called twice")
	}
	b.runCtx, b.hard, b.cancelRun = runCtx, hard, cancelRun
	for _, r := range b.runners {
		b.startLocked(r)
	}
	b.mu.Unlock()
	<-runCtx.Done()
	// A reload waits for its runners; after it, none starts.
	b.reloadMu.Lock()
	b.mu.Lock()
	b.stopped = true
	b.mu.Unlock()
	b.reloadMu.Unlock()
	b.wg.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.firstErr
}

func (b *Bridge) shutdownTimeout() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cfg.Bridge.ShutdownTimeout
}

// startLocked starts r under the run context; b.mu is held. Its own stop
// (a reload) is graceful like the process's: intake stops, in-flight
// messages drain, the lease is released, all within shutdown_timeout.
func (b *Bridge) startLocked(r *runner) {
	ctx, cancel := context.WithCancel(b.runCtx)
	hard, cancelHard := context.WithCancel(b.hard)
	timeout := b.cfg.Bridge.ShutdownTimeout
	stopTimer := context.AfterFunc(ctx, func() { time.AfterFunc(timeout, cancelHard) })
	r.cancel, r.done = cancel, make(chan struct{})
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer close(r.done)
		defer cancelHard()
		defer stopTimer()
		err := r.run(ctx, hard)
		if err == nil {
			return
		}
		b.mu.Lock()
		if b.firstErr == nil || errors.Is(err, lease.ErrDependencyStepDown) {
			b.firstErr = err
		}
		b.mu.Unlock()
		b.cancelRun() // a terminal error stops the whole process
	}()
}

// stop stops a started runner and waits for it.
func (r *runner) stop() {
	if r.cancel != nil {
		r.cancel()
		<-r.done
	}
}

// Ready reports whether every session this instance must serve is at
// ServiceLevelFull; a standby of an exclusive session is ready as standby.
func (b *Bridge) Ready() bool {
	b.mu.Lock()
	runners := b.runners
	b.mu.Unlock()
	for _, r := range runners {
		if !r.ready() {
			return false
		}
	}
	return true
}

// Status is the JSON object of /status.
type Status struct {
	BridgeID       string          `json:"bridge_id"`
	InstanceID     string          `json:"instance_id"`
	DeploymentMode string          `json:"deployment_mode"`
	Ready          bool            `json:"ready"`
	Sessions       []SessionStatus `json:"sessions"`
}

// SessionStatus is one session in /status.
type SessionStatus struct {
	ID           string `json:"id"`
	Mode         string `json:"mode"`
	Role         string `json:"role"` // owner, standby, active (non-exclusive), stopped
	ServiceLevel string `json:"service_level"`
	LeaseVersion int64  `json:"lease_version,omitempty"`
	LeaseOwner   string `json:"lease_owner,omitempty"`
	// LastLeaseEvent is the latest lease transition of this instance
	// (acquired, lost, stepped_down, released, with the reason).
	LastLeaseEvent string `json:"last_lease_event,omitempty"`
	// BrokerPathLostFor is how long the owner's broker path has been
	// lost, or not yet converged since the lease was won (the
	// broker_health_step_down clock), in seconds.
	BrokerPathLostFor *float64             `json:"broker_path_lost_for_s"`
	InFlight          int64                `json:"in_flight"`
	Budget            *budget.BridgeReport `json:"budget,omitempty"`
	Routes            []string             `json:"routes"`
	TakeoverToFull    *float64             `json:"last_takeover_to_full_s"`
	// FailureToFull is the last failure-to-full this instance recorded as
	// a successor (an upper bound; see the metric
	// myriarch_bridge_failover_failure_to_full_seconds).
	FailureToFull     *float64  `json:"last_failure_to_full_s"`
	ServiceLevelSince time.Time `json:"service_level_since"`
	// Spools are the durable spools of the session's routes that this
	// instance holds open (while it serves the session).
	Spools []SpoolStatus `json:"spools,omitempty"`
}

// Status reports the instance and every session.
func (b *Bridge) Status() Status {
	b.mu.Lock()
	cfg, runners := b.cfg, b.runners
	b.mu.Unlock()
	s := Status{BridgeID: cfg.Bridge.ID, InstanceID: b.instanceID, DeploymentMode: string(cfg.Bridge.DeploymentMode), Ready: b.Ready()}
	for _, r := range runners {
		s.Sessions = append(s.Sessions, r.status())
	}
	return s
}

// runner runs one configured session.
type runner struct {
	b       *Bridge
	sess    *config.SessionSettings
	policy  *budget.BridgeReport
	log     *slog.Logger
	manager *lease.Manager
	// Set when started: stop the runner, and its end.
	cancel context.CancelFunc
	done   chan struct{}
	// hard ends shutdown_timeout after the runner's stop began: a tenure
	// still settling then is cut, so that the lease is released within
	// the bound even when step_down_grace is longer.
	hard context.Context

	mu sync.Mutex
	// cfg is the configuration the session's routes come from, and routes
	// those routes; a reload that keeps the session replaces both.
	cfg            *config.Config
	routes         []config.RouteSettings
	gen            int     // counts the reloads that replaced cfg
	cur            *tenure // the tenure being served; nil between tenures
	role           string
	level          transport.Level
	levelSince     time.Time
	lastTakeover   time.Duration
	lastFailure    time.Duration
	lastEvent      string
	brokerStepDown bool
}

// tenure is the state of one serve: one lease tenure of an exclusive
// session, or the whole run of a non-exclusive one. Its fields are guarded
// by runner.mu. Everything a tenure's work reports (levels, the broker
// path) is matched against runner.cur, so that late reports of an ended
// tenure cannot change the state of the next.
type tenure struct {
	own           *lease.Ownership // nil for a non-exclusive session
	start         time.Time
	session       transportSession
	disp          *liveDispatcher
	stamp         fence.Stamp
	guard         fence.Tenure
	servedFull    bool
	pathLostSince time.Time
	quiet         bool
	// spools are the tenure's open spools by route ID (spool.go).
	spools       map[string]*spool.Spool
	spoolsClosed bool // the tenure's spools were closed: open no more
}

func (b *Bridge) newRunner(cfg *config.Config, s *config.SessionSettings) (*runner, error) {
	return b.newRunnerYield(cfg, s, false)
}

// newRunnerYield is newRunner for a session that this process owned until
// a reload re-created it: yield lets a standby take the lease first
// (lease.Config.Yield, one max_jittered_poll of the new cadence).
func (b *Bridge) newRunnerYield(cfg *config.Config, s *config.SessionSettings, yield bool) (*runner, error) {
	r := &runner{b: b, sess: s, log: b.log.With("session", s.ID), role: "active", levelSince: time.Now(),
		cfg: cfg, routes: sessionRoutes(cfg, s.ID)}
	if s.Mode != config.Exclusive {
		return r, nil
	}
	c := cfg.ExclusiveSession(s.ID)
	if c == nil {
		// An exclusive session no route uses still needs the lease, or two
		// instances would consume it at once; it runs at the baseline.
		return nil, fmt.Errorf("exclusive session %q is used by no route", s.ID)
	}
	rep := budget.NewBridgeReport(cfg.Bridge.DeploymentMode, c.Assessment)
	rep.SessionID = s.ID
	r.policy = &rep
	r.role = "standby"
	after, _ := c.Assessment.Policy.BrokerHealthStepDown.After()
	m, err := lease.New(lease.Config{
		Store:              b.store,
		Session:            cfg.Bridge.ID + "/" + s.ID,
		InstanceID:         b.instanceID,
		Endpoint:           cfg.Bridge.HTTPListen,
		Cadence:            c.Assessment.Cadence,
		DependencyStepDown: after,
		OnOwner:            r.own,
		CloseSource: func(context.Context) error {
			r.drain()
			return nil
		},
		Logger:     r.log,
		Registerer: b.reg,
		Clock:      b.clock,
		Yield:      yieldFor(yield, c.Assessment.Cadence.MaxJitteredPoll()),
	})
	if err != nil {
		return nil, err
	}
	r.manager = m
	return r, nil
}

func (r *runner) run(ctx, hard context.Context) error {
	if r.manager == nil {
		r.b.met.Owner.WithLabelValues(r.sess.ID).Set(1)
		stopping := make(chan struct{})
		stopOnce := context.AfterFunc(ctx, func() { close(stopping) })
		defer stopOnce()
		t := &tenure{start: time.Now()}
		r.mu.Lock()
		r.cur = t
		r.mu.Unlock()
		r.serve(hard, stopping, t)
		return nil
	}
	r.b.met.Owner.WithLabelValues(r.sess.ID).Set(0)
	r.mu.Lock()
	r.hard = hard
	r.mu.Unlock()
	// Consume the manager's events (it drops them, counting, when nobody
	// reads) and keep the last lease transition for /status.
	handle := func(e lease.Event) {
		if r.b.onEvent != nil {
			r.b.onEvent(r.sess.ID, e)
		}
		if e.Kind != lease.EventRenewed {
			r.mu.Lock()
			r.lastEvent = e.Kind.String()
			if e.Reason != "" {
				r.lastEvent += " (" + e.Reason + ")"
			}
			r.mu.Unlock()
		}
	}
	stop := make(chan struct{})
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for {
			select {
			case <-stop:
				// Run has returned: what is buffered is the rest of the
				// events (the last step-down and release among them);
				// hand it on before Run's caller sees the return.
				for {
					select {
					case e := <-r.manager.Events():
						handle(e)
					default:
						return
					}
				}
			case e := <-r.manager.Events():
				handle(e)
			}
		}
	}()
	defer func() { close(stop); <-consumed }()
	err := r.manager.Run(ctx)
	if errors.Is(err, lease.ErrDependencyStepDown) {
		r.b.met.StepDowns.WithLabelValues(r.sess.ID).Inc()
		r.mu.Lock()
		r.brokerStepDown, r.role = true, "stepped_down"
		r.mu.Unlock()
	}
	return err
}

// own is one tenure: connect, serve until the lease ends.
//
// The broker-path clock starts at once: an owner that won the lease but
// never reaches full service (wrong address, ACL, firewall) is as unable
// to serve as one that lost its path, and steps down the same way, after
// broker_health_step_down plus one detection round.
func (r *runner) own(o *lease.Ownership) {
	t := &tenure{own: o, start: time.Now()}
	t.pathLostSince = t.start
	o.ReportDependency(false)
	r.b.met.BrokerPathDown.WithLabelValues(r.sess.ID).Set(1)
	r.mu.Lock()
	r.role, r.cur = "owner", t
	r.mu.Unlock()
	r.b.met.Owner.WithLabelValues(r.sess.ID).Set(1)
	r.log.Info("lease acquired; connecting", "version", o.Token().Version)
	// The tenure's work ends with the tenure, or when shutdown_timeout
	// has passed since the stop began: the manager releases the lease
	// once this returns, so a stop never holds the lease longer than
	// shutdown_timeout plus the bounded release.
	ctx, cancel := context.WithCancel(o.Context())
	defer cancel()
	r.mu.Lock()
	hard := r.hard
	r.mu.Unlock()
	if hard != nil {
		defer context.AfterFunc(hard, cancel)()
	}
	r.serve(ctx, o.Stopping(), t)
	r.b.met.Owner.WithLabelValues(r.sess.ID).Set(0)
	r.b.met.BrokerPathDown.WithLabelValues(r.sess.ID).Set(0)
	r.mu.Lock()
	if r.cur == t {
		r.cur = nil
		if r.role == "owner" {
			r.role = "standby"
		}
	}
	r.mu.Unlock()
}

// serve runs a fresh transport session with fresh routes until ctx ends
// (stop now) or stopping closes (drain, then stop). For an exclusive
// session, every message is stamped with the tenure's lease version and
// every point of action checks the tenure (t.own).
func (r *runner) serve(ctx context.Context, stopping <-chan struct{}, t *tenure) {
	var stamp fence.Stamp
	var guard fence.Tenure
	if t.own != nil {
		stamp, guard = fence.New(uint64(t.own.Token().Version), r.manager.Session()), t.own
	}
	t.stamp, t.guard = stamp, guard
	r.mu.Lock()
	cfg, routeSettings, gen := r.cfg, r.routes, r.gen
	r.mu.Unlock()
	if err := r.openSpools(ctx, t, cfg, routeSettings); err != nil {
		r.log.Error("spool", "err", err)
		r.closeSpools(t)
		return
	}
	defer r.closeSpools(t)
	disp := &liveDispatcher{}
	disp.cur.Store(&routing.Dispatcher{Session: r.sess.ID, Routes: r.buildRoutes(cfg, routeSettings, t), Metrics: r.b.met})
	r.mu.Lock()
	t.disp = disp
	stale := r.gen != gen
	r.mu.Unlock()
	if stale {
		// A reload replaced the routes while these were built.
		r.refresh(context.WithoutCancel(ctx), t)
	}
	var subs []transport.Subscription
	for _, t := range config.Subscriptions(cfg, r.sess.ID) {
		subs = append(subs, transport.Subscription{Filter: t.Filter, QoS: t.QoS})
	}
	clientID := r.sess.ClientID
	if r.sess.ClientIDInstance {
		clientID += "-" + r.b.instanceID
	}
	tc, err := mqttconn.TLSConfig(tlsFiles(r.sess.TLS))
	if err != nil {
		r.log.Error("TLS configuration", "err", err)
		for _, rt := range disp.retire() {
			rt.Close()
		}
		return
	}
	s, err := newSession(r.sess.ProtocolVersion, transport.Config{Brokers: r.sess.Brokers, ClientID: clientID, CleanStart: r.sess.CleanStart,
		SessionExpiry: r.sess.SessionExpiryInterval, KeepAlive: r.sess.KeepAlive, Username: r.sess.Username,
		Password: []byte(r.sess.Password.Reveal()), TLS: tc, ConnectTimeout: r.sess.ConnectTimeout,
		ReconcileTimeout: r.sess.ReconcileTimeout, UnmatchedGrace: r.sess.UnmatchedGrace,
		ReceiveMaximum: uint16(r.sess.ReceiveMaximum), Subscriptions: subs, Handler: disp.Handle,
		OnLevel: func(l transport.Level) { r.onLevel(t, l) }, Logger: r.log, Tenure: guard,
		StateFile: filepath.Join(cfg.Bridge.StateDir, cfg.Bridge.ID+"-"+r.sess.ID+".subscriptions.json")})
	if err != nil {
		r.log.Error("transport", "err", err)
		for _, rt := range disp.retire() {
			rt.Close()
		}
		return
	}
	r.mu.Lock()
	t.session = s
	r.mu.Unlock()

	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Run(sctx)
	}()
	select {
	case <-ctx.Done():
		r.setQuiet(t)
	case <-stopping:
		r.setQuiet(t)
		// Graceful: stop intake, drain what is in flight.
		s.Drain()
		for _, rt := range disp.routes() {
			if err := rt.WaitIdle(ctx); err != nil {
				r.log.Warn("in-flight messages left unacknowledged for the next owner", "route", rt.ID(), "in_flight", rt.InFlight())
			}
		}
	case <-done:
		// The transport gave up: the tenure ended (its deadline passed)
		// and it will not connect again.
		r.setQuiet(t)
	}
	// Withdraw what the routes still hold: a sender that has not started
	// a message of this tenure will not, and it stays unacknowledged.
	for _, rt := range disp.retire() {
		rt.Close()
	}
	cancel()
	<-done
	r.mu.Lock()
	t.session, t.disp = nil, nil
	r.mu.Unlock()
}

// transportSession is what a runner needs of a receiving session; the MQTT
// 5 (transport/mqtt) and MQTT 3.1.1 (transport/mqtt311) sessions both
// provide it, from the same transport.Config.
type transportSession interface {
	Run(ctx context.Context) error
	Drain()
}

// newSession creates the receiving session of the session's
// protocol_version.
func newSession(version string, cfg transport.Config) (transportSession, error) {
	if version == config.MQTT311 {
		return mqtt311.New(cfg)
	}
	return mqtt.New(cfg)
}

// setQuiet marks the end of a tenure or of the process: the level drops
// that follow are not broker-path losses.
func (r *runner) setQuiet(t *tenure) {
	r.mu.Lock()
	t.quiet = true
	r.mu.Unlock()
}

// drain is the lease manager's first step-down phase: stop intake.
func (r *runner) drain() {
	r.mu.Lock()
	var s transportSession
	if r.cur != nil {
		s = r.cur.session
	}
	r.mu.Unlock()
	if s != nil {
		s.Drain()
	}
}

// onLevel is a tenure's transport reporting its service level.
func (r *runner) onLevel(t *tenure, l transport.Level) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != t {
		return // a late report of an ended tenure
	}
	r.b.met.ServiceLevel.WithLabelValues(r.sess.ID).Set(float64(l))
	r.level, r.levelSince = l, time.Now()
	if t.own == nil {
		return
	}
	switch {
	case l == transport.LevelFull:
		if !t.servedFull {
			t.servedFull = true
			r.lastTakeover = time.Since(t.start)
			r.b.met.TakeoverToFull.WithLabelValues(r.sess.ID).Observe(r.lastTakeover.Seconds())
			attrs := []any{"takeover_to_full", r.lastTakeover}
			if at, ok := t.own.PreviousOwnerAlive(); ok {
				r.lastFailure = time.Since(at)
				r.b.met.FailureToFull.WithLabelValues(r.sess.ID).Observe(r.lastFailure.Seconds())
				attrs = append(attrs, "failure_to_full_at_most", r.lastFailure)
			}
			r.log.Info("service level full", attrs...)
		} else {
			r.log.Info("broker path restored", "lost_for", time.Since(t.pathLostSince))
		}
		t.pathLostSince = time.Time{}
		r.b.met.BrokerPathDown.WithLabelValues(r.sess.ID).Set(0)
		t.own.ReportDependency(true)
	case t.pathLostSince.IsZero() && !t.quiet:
		// The broker-path clock starts when the path is lost while
		// serving (before full service it has run since the acquisition).
		t.pathLostSince = time.Now()
		r.b.met.BrokerPathDown.WithLabelValues(r.sess.ID).Set(1)
		r.log.Warn("broker path lost while owning", "level", l.String())
		t.own.ReportDependency(false)
	}
}

func (r *runner) ready() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch r.role {
	case "standby":
		return true
	case "stepped_down":
		return false
	}
	return r.level == transport.LevelFull
}

func (r *runner) status() SessionStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := SessionStatus{ID: r.sess.ID, Mode: r.sess.Mode, Role: r.role, ServiceLevel: r.level.String(), Budget: r.policy,
		ServiceLevelSince: r.levelSince}
	for _, rt := range r.routes {
		st.Routes = append(st.Routes, rt.ID)
	}
	if t := r.cur; t != nil && t.disp != nil {
		for _, rt := range t.disp.routes() {
			st.InFlight += rt.InFlight()
		}
		if !t.pathLostSince.IsZero() {
			v := time.Since(t.pathLostSince).Seconds()
			st.BrokerPathLostFor = &v
		}
	}
	if r.lastTakeover > 0 {
		v := r.lastTakeover.Seconds()
		st.TakeoverToFull = &v
	}
	if r.lastFailure > 0 {
		v := r.lastFailure.Seconds()
		st.FailureToFull = &v
	}
	st.LastLeaseEvent = r.lastEvent
	if t := r.cur; t != nil {
		st.Spools = spoolStatus(t)
	}
	if r.manager != nil {
		if o := r.manager.Ownership(); o != nil {
			st.LeaseVersion = o.Token().Version
			st.LeaseOwner = o.Token().Owner
		}
	}
	return st
}

// StatusJSON implements health.Source.
func (b *Bridge) StatusJSON() any { return b.Status() }

func yieldFor(yield bool, d time.Duration) time.Duration {
	if yield {
		return d
	}
	return 0
}
