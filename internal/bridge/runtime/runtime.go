// Package runtime runs a validated bridge configuration: it opens the
// senders and the lease store, runs every session — exclusive ones under a
// lease manager, connecting only while they hold the lease — and exposes
// what /ready and /status report.
//
// An exclusive session connects to its broker only after the lease is
// acquired and disconnects when it is lost; the next tenure gets a fresh
// transport session in the same process. The one exception is a
// broker-path step-down: it is terminal, Run returns
// lease.ErrBrokerPathStepDown and the process exits non-zero, because an
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

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/metrics"
	"github.com/myriarch/myriarch/internal/bridge/mqttconn"
	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/transport/mqtt"
	"github.com/myriarch/myriarch/internal/disclose"
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
	runners    []*runner
	onEvent    func(session string, e lease.Event)
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
		onEvent: opts.OnLeaseEvent}
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
		r, err := b.newRunner(&cfg.Sessions[i], opts.Clock)
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
		r := disclose.NewBridgeReport(c.Assessment)
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
// are released. It returns lease.ErrBrokerPathStepDown after a broker-path
// step-down (after shutting the rest down), or the first fatal error.
func (b *Bridge) Run(ctx context.Context) error {
	defer b.closeAll(context.Background())
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	// hard ends everything shutdown_timeout after the graceful stop began.
	hard, cancelHard := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHard()
	stopTimer := context.AfterFunc(runCtx, func() {
		time.AfterFunc(b.cfg.Bridge.ShutdownTimeout, cancelHard)
	})
	defer stopTimer()

	errs := make(chan error, len(b.runners))
	var wg sync.WaitGroup
	for _, r := range b.runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := r.run(runCtx, hard)
			if err != nil {
				cancelRun() // a terminal error stops the whole process
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	var first error
	for err := range errs {
		if err != nil && (first == nil || errors.Is(err, lease.ErrBrokerPathStepDown)) {
			first = err
		}
	}
	return first
}

// Ready reports whether every session this instance must serve is at
// ServiceLevelFull; a standby of an exclusive session is ready as standby.
func (b *Bridge) Ready() bool {
	for _, r := range b.runners {
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
	BrokerPathLostFor *float64               `json:"broker_path_lost_for_s"`
	InFlight          int64                  `json:"in_flight"`
	Budget            *disclose.BridgeReport `json:"budget,omitempty"`
	Routes            []string               `json:"routes"`
	TakeoverToFull    *float64               `json:"last_takeover_to_full_s"`
	// FailureToFull is the last failure-to-full this instance recorded as
	// a successor (an upper bound; see the metric
	// myriarch_bridge_failover_failure_to_full_seconds).
	FailureToFull     *float64  `json:"last_failure_to_full_s"`
	ServiceLevelSince time.Time `json:"service_level_since"`
}

// Status reports the instance and every session.
func (b *Bridge) Status() Status {
	s := Status{BridgeID: b.cfg.Bridge.ID, InstanceID: b.instanceID, DeploymentMode: string(b.cfg.Bridge.DeploymentMode), Ready: b.Ready()}
	for _, r := range b.runners {
		s.Sessions = append(s.Sessions, r.status())
	}
	return s
}

// runner runs one configured session.
type runner struct {
	b       *Bridge
	sess    *config.SessionSettings
	routes  []config.RouteSettings
	policy  *disclose.BridgeReport
	log     *slog.Logger
	manager *lease.Manager

	mu             sync.Mutex
	cur            *tenure // the tenure being served; nil between tenures
	role           string
	level          mqtt.Level
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
	session       *mqtt.Session
	routes        []*routing.Route
	servedFull    bool
	pathLostSince time.Time
	quiet         bool
}

func (b *Bridge) newRunner(s *config.SessionSettings, clock lease.Clock) (*runner, error) {
	r := &runner{b: b, sess: s, log: b.log.With("session", s.ID), role: "active", levelSince: time.Now()}
	for _, rt := range b.cfg.Routes {
		if rt.Session == s.ID {
			r.routes = append(r.routes, rt)
		}
	}
	if s.Mode != config.Exclusive {
		return r, nil
	}
	c := b.cfg.ExclusiveSession(s.ID)
	if c == nil {
		// An exclusive session no route uses still needs the lease, or two
		// instances would consume it at once; it runs at the baseline.
		return nil, fmt.Errorf("exclusive session %q is used by no route", s.ID)
	}
	rep := disclose.NewBridgeReport(c.Assessment)
	rep.SessionID = s.ID
	r.policy = &rep
	r.role = "standby"
	after, _ := c.Assessment.Policy.BrokerHealthStepDown.After()
	m, err := lease.New(lease.Config{
		Store:                b.store,
		Session:              b.cfg.Bridge.ID + "/" + s.ID,
		InstanceID:           b.instanceID,
		Endpoint:             b.cfg.Bridge.HTTPListen,
		Cadence:              c.Assessment.Cadence,
		BrokerHealthStepDown: after,
		OnOwner:              r.own,
		CloseSource: func(context.Context) error {
			r.drain()
			return nil
		},
		Logger:     r.log,
		Registerer: b.reg,
		Clock:      clock,
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
	// Consume the manager's events (it drops them, counting, when nobody
	// reads) and keep the last lease transition for /status.
	stop := make(chan struct{})
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for {
			select {
			case <-stop:
				return
			case e := <-r.manager.Events():
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
		}
	}()
	defer func() { close(stop); <-consumed }()
	err := r.manager.Run(ctx)
	if errors.Is(err, lease.ErrBrokerPathStepDown) {
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
	o.ReportBrokerPath(false)
	r.b.met.BrokerPathDown.WithLabelValues(r.sess.ID).Set(1)
	r.mu.Lock()
	r.role, r.cur = "owner", t
	r.mu.Unlock()
	r.b.met.Owner.WithLabelValues(r.sess.ID).Set(1)
	r.log.Info("lease acquired; connecting", "version", o.Token().Version)
	r.serve(o.Context(), o.Stopping(), t)
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
	var routes []*routing.Route
	for _, rt := range r.routes {
		recv := r.b.cfg.Receiver(rt.Receiver)
		var filters []string
		for _, t := range recv.Topics {
			filters = append(filters, t.Filter)
		}
		var targets []routing.Target
		for _, id := range rt.Senders {
			st := r.b.cfg.Sender(id)
			targets = append(targets, routing.Target{ID: id, Sender: r.b.senders[id], MaxAttempts: st.MaxAttempts,
				InitialBackoff: st.InitialBackoff, MaxBackoff: st.MaxBackoff})
		}
		routes = append(routes, routing.NewRoute(routing.RouteConfig{ID: rt.ID, Filters: filters, Targets: targets,
			MaxInFlight: rt.MaxInFlight, StripPrefix: rt.StripPrefix, AddPrefix: rt.AddPrefix, Retain: routing.RetainPolicy(rt.Retain), Mappings: mappings(rt.Mappings), DeadLetter: r.b.dl,
			Metrics: r.b.met, Logger: r.log, Fence: stamp, Tenure: guard}))
	}
	var subs []mqtt.Subscription
	seen := map[string]bool{}
	for _, recv := range r.b.cfg.Receivers {
		if recv.Session != r.sess.ID {
			continue
		}
		for _, t := range recv.Topics {
			if !seen[t.Filter] {
				seen[t.Filter] = true
				subs = append(subs, mqtt.Subscription{Filter: t.Filter, QoS: t.QoS})
			}
		}
	}
	clientID := r.sess.ClientID
	if r.sess.ClientIDInstance {
		clientID += "-" + r.b.instanceID
	}
	tc, err := mqttconn.TLSConfig(tlsFiles(r.sess.TLS))
	if err != nil {
		r.log.Error("TLS configuration", "err", err)
		return
	}
	d := &routing.Dispatcher{Session: r.sess.ID, Routes: routes, Metrics: r.b.met}
	s, err := mqtt.New(mqtt.Config{Brokers: r.sess.Brokers, ClientID: clientID, CleanStart: r.sess.CleanStart,
		SessionExpiry: r.sess.SessionExpiryInterval, KeepAlive: r.sess.KeepAlive, Username: r.sess.Username,
		Password: []byte(r.sess.Password.Reveal()), TLS: tc, ConnectTimeout: r.sess.ConnectTimeout,
		ReconcileTimeout: r.sess.ReconcileTimeout, UnmatchedGrace: r.sess.UnmatchedGrace,
		ReceiveMaximum: uint16(r.sess.ReceiveMaximum), Subscriptions: subs, Handler: d.Handle,
		OnLevel: func(l mqtt.Level) { r.onLevel(t, l) }, Logger: r.log, Tenure: guard,
		StateFile: filepath.Join(r.b.cfg.Bridge.StateDir, r.b.cfg.Bridge.ID+"-"+r.sess.ID+".subscriptions.json")})
	if err != nil {
		r.log.Error("transport", "err", err)
		return
	}
	r.mu.Lock()
	t.session, t.routes = s, routes
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
		for _, rt := range routes {
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
	for _, rt := range routes {
		rt.Close()
	}
	cancel()
	<-done
	r.mu.Lock()
	t.session, t.routes = nil, nil
	r.mu.Unlock()
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
	var s *mqtt.Session
	if r.cur != nil {
		s = r.cur.session
	}
	r.mu.Unlock()
	if s != nil {
		s.Drain()
	}
}

// onLevel is a tenure's transport reporting its service level.
func (r *runner) onLevel(t *tenure, l mqtt.Level) {
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
	case l == mqtt.LevelFull:
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
		t.own.ReportBrokerPath(true)
	case t.pathLostSince.IsZero() && !t.quiet:
		// The broker-path clock starts when the path is lost while
		// serving (before full service it has run since the acquisition).
		t.pathLostSince = time.Now()
		r.b.met.BrokerPathDown.WithLabelValues(r.sess.ID).Set(1)
		r.log.Warn("broker path lost while owning", "level", l.String())
		t.own.ReportBrokerPath(false)
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
	return r.level == mqtt.LevelFull
}

func (r *runner) status() SessionStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := SessionStatus{ID: r.sess.ID, Mode: r.sess.Mode, Role: r.role, ServiceLevel: r.level.String(), Budget: r.policy,
		ServiceLevelSince: r.levelSince}
	for _, rt := range r.routes {
		st.Routes = append(st.Routes, rt.ID)
	}
	if t := r.cur; t != nil {
		for _, rt := range t.routes {
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
