package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Manager for one exclusive session.
type Config struct {
	// Store is the lease store. Required.
	Store Store
	// Session is the session id: the lease row. Required.
	Session string
	// InstanceID names this instance; the owner id is
	// OwnerID(InstanceID) = "instance#boot-nonce". Required unless Owner
	// is set. Two managers of one session in one process need distinct
	// instance ids.
	InstanceID string
	// Owner overrides the owner id (tests, embedding). Must be unique per
	// process and session.
	Owner string
	// Endpoint is advertised in the lease row while this process owns it.
	Endpoint string
	// Cadence is the resolved lease cadence (failover.ResolveCadence).
	// Required.
	Cadence failover.Cadence
	// DependencyStepDown is how long the owner's dependency path (what its
	// work needs besides the lease, e.g. the bridge's broker connection)
	// may stay unhealthy before the owner steps down for good; 0 is off.
	// See Manager.ReportDependency.
	DependencyStepDown time.Duration
	// OnOwner, if set, runs in its own goroutine for each tenure. It must
	// act only while own.Valid(), stop taking input when own.Stopping() is
	// closed, and return promptly when own.Context() is done.
	OnOwner func(own *Ownership)
	// CloseSource, if set, is the first step-down phase: close the input
	// of the owner's work. Its context ends after
	// min(5s, step_down_grace), and the step-down goes on at that bound
	// even if CloseSource has not returned.
	CloseSource func(ctx context.Context) error
	// Logger receives the manager's logs; nil means slog.Default().
	Logger *slog.Logger
	// Registerer receives the lease metrics; nil registers none. Managers
	// on one Registerer share the collectors.
	Registerer prometheus.Registerer
	// EventBuffer is the capacity of the Events channel; 0 means 16.
	// A full channel drops events; it never blocks the manager.
	EventBuffer int
	// Clock is the clock of the owner's local deadline; nil means
	// BootClock on Linux (it counts host suspend) and SystemClock
	// elsewhere.
	Clock Clock
	// Yield, when positive, delays the first Acquire by this long. A
	// manager that replaces one this process has just stepped down from
	// (a reload that re-creates an owned session) sets it, so that a
	// standby, which the release woke, takes the lease rather than this
	// process winning it back at once: the planned-stop hand-over. With
	// the standby's max_jittered_poll a live standby wins even without
	// the wake-up; with no standby, the session waits that long.
	Yield time.Duration
}

// EventKind is what happened.
type EventKind int

// Event kinds.
const (
	EventAcquired EventKind = iota + 1
	EventRenewed
	EventLost
	EventSteppedDown
	EventReleased
)

func (k EventKind) String() string {
	switch k {
	case EventAcquired:
		return "acquired"
	case EventRenewed:
		return "renewed"
	case EventLost:
		return "lost"
	case EventSteppedDown:
		return "stepped_down"
	case EventReleased:
		return "released"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Step-down reasons (Event.Reason and the reason label of
// myriarch_lease_step_downs_total).
const (
	ReasonDeadline      = "deadline"       // the local deadline passed before a renew succeeded
	ReasonLost          = "lost"           // the store refused a renew definitively
	ReasonRenewFailures = "renew_failures" // after max_renew_fails, the authoritative read named someone else
	ReasonDependency    = "dependency"     // dependency path unhealthy for DependencyStepDown (Run returns)
	ReasonShutdown      = "shutdown"       // Run's context ended
)

// Event is one lifecycle event of a session.
type Event struct {
	Kind    EventKind
	Session string
	Token   Token
	// Reason is set on EventLost and EventSteppedDown.
	Reason string
	// Err is the error behind a loss or a failed release, if any.
	Err  error
	Time time.Time
}

// Manager runs the lease loop of one exclusive session. Create it with
// New and run it with Run.
type Manager struct {
	cfg     Config
	owner   string
	clock   Clock
	log     *slog.Logger
	met     *metrics
	events  chan Event
	minPoll time.Duration
	maxPoll time.Duration

	mu             sync.Mutex
	current        *Ownership
	unhealthySince time.Time // zero while the dependency path is healthy
	running        bool

	work sync.WaitGroup
}

// New checks cfg and returns a Manager. It opens nothing.
func New(cfg Config) (*Manager, error) {
	var errs []error
	if cfg.Store == nil {
		errs = append(errs, errors.New("lease: Config.Store is required"))
	}
	if cfg.Session == "" {
		errs = append(errs, errors.New("lease: Config.Session is required"))
	}
	if cfg.InstanceID == "" && cfg.Owner == "" {
		errs = append(errs, errors.New("lease: Config.InstanceID is required"))
	}
	c := cfg.Cadence
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"lease_ttl", c.LeaseTTL}, {"renew_interval", c.RenewInterval}, {"renew_call_timeout", c.RenewCallTimeout}, {"acquire_poll_interval", c.AcquirePollInterval}} {
		if f.d <= 0 {
			errs = append(errs, fmt.Errorf("lease: cadence %s: %v: must be positive (resolve it with failover.ResolveCadence)", f.name, f.d))
		}
	}
	if c.LeaseRenewJitter < 0 || c.StepDownGrace < 0 || cfg.DependencyStepDown < 0 {
		errs = append(errs, errors.New("lease: cadence LeaseRenewJitter, StepDownGrace and DependencyStepDown must not be negative"))
	}
	if c.MaxRenewFails <= 0 {
		errs = append(errs, fmt.Errorf("lease: cadence max_renew_fails: %d: must be positive", c.MaxRenewFails))
	}
	if c.RenewCallTimeout >= c.LeaseTTL && c.LeaseTTL > 0 {
		errs = append(errs, fmt.Errorf("lease: cadence renew_call_timeout %v must be shorter than lease_ttl %v", c.RenewCallTimeout, c.LeaseTTL))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	m := &Manager{cfg: cfg, owner: cfg.Owner, clock: cfg.Clock, log: cfg.Logger,
		minPoll: c.MinJitteredPoll(), maxPoll: c.MaxJitteredPoll()}
	if m.owner == "" {
		m.owner = OwnerID(cfg.InstanceID)
	}
	if m.clock == nil {
		m.clock = defaultOwnerClock()
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	m.log = m.log.With("session", cfg.Session, "owner", m.owner)
	n := cfg.EventBuffer
	if n <= 0 {
		n = 16
	}
	m.events = make(chan Event, n)
	met, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("lease: registering metrics: %w", err)
	}
	m.met = met
	m.met.isOwner.WithLabelValues(cfg.Session).Set(0)
	return m, nil
}

// Session is the session id (the lease row) this manager competes for.
func (m *Manager) Session() string { return m.cfg.Session }

// OwnerID is the owner id this manager acquires under.
func (m *Manager) OwnerID() string { return m.owner }

// Events delivers lifecycle events. The channel is never closed; events
// that find it full are dropped (and counted).
func (m *Manager) Events() <-chan Event { return m.events }

// Ownership returns the current tenure, or nil while standing by.
func (m *Manager) Ownership() *Ownership {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.current
}

// ReportDependency is the hook the owner's work drives for its dependency
// path (what it needs besides the lease to do its work): false when the
// path is lost, true when restored. When the path stays lost for
// DependencyStepDown, checked at the top of each renew round, the owner
// steps down, releases the lease and Run returns ErrDependencyStepDown.
// A new tenure starts with a healthy path; work that has not reached its
// dependency yet reports false at once, so that an owner that never
// converges steps down too (see Ownership.ReportDependency, which a
// tenure's own work should prefer: it cannot touch a later tenure).
func (m *Manager) ReportDependency(healthy bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reportDependency(healthy)
}

// reportDependency is ReportDependency with m.mu held.
func (m *Manager) reportDependency(healthy bool) {
	switch {
	case healthy:
		m.unhealthySince = time.Time{}
	case m.unhealthySince.IsZero():
		m.unhealthySince = m.clock.Now()
	}
}

func (m *Manager) emit(e Event) {
	e.Session = m.cfg.Session
	e.Time = time.Now()
	select {
	case m.events <- e:
	default:
		m.met.eventsDropped.WithLabelValues(m.cfg.Session).Inc()
	}
}

// Run competes for the lease and, while it owns it, renews it and runs
// OnOwner, until ctx ends (it then steps down, releases the lease and
// returns nil) or a dependency step-down (it returns
// ErrDependencyStepDown and does not compete again; what the program does
// then is its own policy). A lost
// lease sends the manager back to standing by. Run returns only after the
// OnOwner goroutines it started have returned. Run may be called once.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	if m.running {
		m.mu.Unlock()
		return errors.New("lease: Manager.Run called twice")
	}
	m.running = true
	m.mu.Unlock()
	defer m.work.Wait()
	m.log.Info("lease manager started", "ttl", m.cfg.Cadence.LeaseTTL, "renew_interval", m.cfg.Cadence.RenewInterval,
		"acquire_poll_interval", m.cfg.Cadence.AcquirePollInterval, "renew_call_timeout", m.cfg.Cadence.RenewCallTimeout)
	if m.cfg.Yield > 0 {
		t := time.NewTimer(m.cfg.Yield)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
	for {
		tok, deadline, seen, ok := m.standBy(ctx)
		if !ok {
			return nil
		}
		if err := m.own(ctx, tok, deadline, seen); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		m.waitTenure()
	}
}

// waitTenure waits until the previous tenure's OnOwner has returned, so
// that no work of an ended tenure overlaps the next one. The step-down
// stops waiting for the work at its bound (the lease must be released on
// time), but the next Acquire waits here: the work was cancelled by then
// and must return promptly. The wait delays only this process's own next
// tenure, never another instance's takeover, so it adds nothing to the
// failover budgets; a wait beyond the step-down phase bound is logged.
func (m *Manager) waitTenure() {
	done := make(chan struct{})
	go func() {
		m.work.Wait()
		close(done)
	}()
	t := time.NewTimer(m.cfg.Cadence.StepDownPhaseBound())
	defer t.Stop()
	select {
	case <-done:
		return
	case <-t.C:
	}
	m.log.Warn("the previous tenure's work has not returned; waiting for it before competing for the lease again")
	start := time.Now()
	<-done
	m.log.Info("the previous tenure's work returned", "waited", time.Since(start))
}

// pollDelay is acquire_poll_interval ± 25 %: uniform in
// [min_jittered_poll, max_jittered_poll].
func (m *Manager) pollDelay() time.Duration {
	return m.minPoll + rand.N(m.maxPoll-m.minPoll+1)
}

// renewDelay is renew_interval + U[−J/2, +J/2), never past the deadline.
func (m *Manager) renewDelay(deadline time.Time) time.Duration {
	c := m.cfg.Cadence
	d := c.RenewInterval
	if j := c.LeaseRenewJitter; j > 0 {
		d += rand.N(j) - j/2
	}
	return max(0, min(d, deadline.Sub(m.clock.Now())))
}

// ReleaseNotifier is implemented by stores that can tell a standby at once
// that a lease was released (the stores of this module do). The channel
// receives a value when lease id may have been released, until ctx ends; a
// nil channel means the store cannot tell. A notification is only a hint:
// the standby then calls Acquire at once instead of at its next poll, and
// the poll stays its bound (a crashed owner releases nothing, and its
// takeover keeps the observation protocol and its budget).
type ReleaseNotifier interface {
	NotifyRelease(ctx context.Context, id string) <-chan struct{}
}

// standBy calls Acquire every jittered poll until it is granted or ctx
// ends, and at once when the store reports the lease released. The first
// call sets the observation baseline. It also returns the
// latest time, on time.Now's monotonic clock, at which the previous owner
// is known to have been alive (zero when no renewal of another owner was
// observed): the start of the last poll that read the row before the
// previous owner's last observed renewal. (A release is not counted: the
// granting call cannot tell it from a takeover after the expiry.)
func (m *Manager) standBy(ctx context.Context) (Token, time.Time, time.Time, bool) {
	c := m.cfg.Cadence
	claim := Claim{ID: m.cfg.Session, Owner: m.owner, TTL: c.LeaseTTL, Endpoint: m.cfg.Endpoint}
	var released <-chan struct{}
	if n, ok := m.cfg.Store.(ReleaseNotifier); ok {
		nctx, stop := context.WithCancel(ctx)
		defer stop()
		released = n.NotifyRelease(nctx, m.cfg.Session)
	}
	var lastHolder string
	// The previous owner's write that the last reading poll saw, and when
	// that poll started. Only polls that read the row count: a failed one
	// says nothing about when the row changed.
	var lastWrite ownerWrite
	var lastRead, aliveAt time.Time
	for {
		if ctx.Err() != nil {
			return Token{}, time.Time{}, time.Time{}, false
		}
		pre := m.clock.Now()
		start := time.Now()
		tok, err := bounded(ctx, c.RenewCallTimeout, "acquire", func(cctx context.Context) (Token, error) {
			return m.cfg.Store.Acquire(cctx, claim)
		})
		lat := time.Since(start).Seconds()
		switch {
		case err == nil:
			deadline := LocalDeadline(pre, c.LeaseTTL)
			if m.clock.Now().Before(deadline) {
				m.met.acquireSeconds.WithLabelValues("acquired").Observe(lat)
				m.met.acquireAttempts.WithLabelValues("acquired").Inc()
				return tok, deadline, aliveAt, true
			}
			m.log.Warn("lease granted after its local deadline had already passed; not acting on it", "version", tok.Version)
		case errors.Is(err, ErrHeld):
			m.met.acquireSeconds.WithLabelValues("held").Observe(lat)
			m.met.acquireAttempts.WithLabelValues("held").Inc()
			var he *HeldError
			if errors.As(err, &he) {
				if he.Record.Owner != lastHolder {
					lastHolder = he.Record.Owner
					m.log.Info("standing by: lease held", "holder", he.Record.Owner, "version", he.Record.Version, "endpoint", he.Record.Endpoint)
				}
				w := ownerWrite{owner: he.Record.Owner, version: he.Record.Version, renewedAt: he.Record.RenewedAt}
				if w != lastWrite {
					// A new renewal (or a new owner) since the last
					// reading poll: the owner was alive after that poll
					// started.
					aliveAt = lastRead
					lastWrite = w
				}
				lastRead = start
			}
		default:
			m.met.acquireSeconds.WithLabelValues("error").Observe(lat)
			m.met.acquireAttempts.WithLabelValues("error").Inc()
			if ctx.Err() == nil {
				m.log.Warn("acquire failed", "err", err)
			}
		}
		t := time.NewTimer(m.pollDelay())
		select {
		case <-ctx.Done():
			t.Stop()
			return Token{}, time.Time{}, time.Time{}, false
		case <-t.C:
		case <-released:
			t.Stop()
		}
	}
}

// ownerWrite identifies one write of the lease row by its owner.
type ownerWrite struct {
	owner     string
	version   int64
	renewedAt time.Time
}

// own runs one tenure. It returns ErrDependencyStepDown for the dependency
// step-down and nil otherwise.
func (m *Manager) own(ctx context.Context, tok Token, deadline, prevAlive time.Time) error {
	c := m.cfg.Cadence
	o := newOwnership(context.WithoutCancel(ctx), tok, m.clock, deadline)
	o.m, o.prevAlive = m, prevAlive
	m.mu.Lock()
	m.current = o
	m.unhealthySince = time.Time{}
	m.mu.Unlock()
	m.met.isOwner.WithLabelValues(m.cfg.Session).Set(1)
	m.met.version.WithLabelValues(m.cfg.Session).Set(float64(tok.Version))
	m.met.transfers.WithLabelValues(m.cfg.Session).Inc()
	m.log.Info("lease acquired", "version", tok.Version, "local_deadline_in", deadline.Sub(m.clock.Now()))
	m.emit(Event{Kind: EventAcquired, Token: tok})

	workDone := make(chan struct{})
	if m.cfg.OnOwner != nil {
		m.work.Add(1)
		go func() {
			defer m.work.Done()
			defer close(workDone)
			m.cfg.OnOwner(o)
		}()
	} else {
		close(workDone)
	}

	fails := 0
	timer := time.NewTimer(m.renewDelay(deadline))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return m.stepDown(o, workDone, ReasonShutdown, nil, true)
		case <-o.Context().Done():
			return m.stepDown(o, workDone, ReasonDeadline, context.Cause(o.Context()), true)
		case <-timer.C:
		}
		// Top of the renew round.
		if !m.clock.Now().Before(deadline) {
			return m.stepDown(o, workDone, ReasonDeadline, ErrExpired, true)
		}
		if after := m.cfg.DependencyStepDown; after > 0 {
			m.mu.Lock()
			since := m.unhealthySince
			m.mu.Unlock()
			if !since.IsZero() && m.clock.Now().Sub(since) >= after {
				return m.stepDown(o, workDone, ReasonDependency, nil, true)
			}
		}
		pre := m.clock.Now()
		start := time.Now()
		_, err := bounded(ctx, min(c.RenewCallTimeout, max(time.Millisecond, deadline.Sub(pre))), "renew",
			func(cctx context.Context) (struct{}, error) {
				return struct{}{}, m.cfg.Store.Renew(cctx, m.cfg.Session, tok, c.LeaseTTL)
			})
		lat := time.Since(start).Seconds()
		switch {
		case err == nil:
			m.met.renewSeconds.WithLabelValues("ok").Observe(lat)
			nd := LocalDeadline(pre, c.LeaseTTL)
			if !o.extend(nd) {
				return m.stepDown(o, workDone, ReasonDeadline, ErrExpired, true)
			}
			deadline = nd
			if fails > 0 {
				m.log.Info("renew succeeded after failures", "failures", fails)
			}
			fails = 0
			m.emit(Event{Kind: EventRenewed, Token: tok})
		case Definitive(err):
			m.met.renewSeconds.WithLabelValues("definitive").Observe(lat)
			m.met.renewFailures.WithLabelValues(m.cfg.Session, "definitive").Inc()
			return m.stepDown(o, workDone, ReasonLost, err, errors.Is(err, ErrExpired))
		default:
			m.met.renewSeconds.WithLabelValues("error").Observe(lat)
			m.met.renewFailures.WithLabelValues(m.cfg.Session, "transient").Inc()
			fails++
			m.log.Warn("renew failed", "err", err, "streak", fails, "max_renew_fails", c.MaxRenewFails)
			if fails >= c.MaxRenewFails {
				// One authoritative read decides, on every round while
				// the streak lasts.
				rec, rerr := bounded(ctx, min(c.RenewCallTimeout, max(time.Millisecond, deadline.Sub(m.clock.Now()))), "current",
					func(rctx context.Context) (Record, error) { return m.cfg.Store.Current(rctx, m.cfg.Session) })
				switch {
				case rerr != nil:
					m.log.Warn("authoritative read failed; keeping the lease until the local deadline", "err", rerr)
				case rec.Owner != tok.Owner || rec.Version != tok.Version:
					return m.stepDown(o, workDone, ReasonRenewFailures,
						fmt.Errorf("%w: the store names %q v%d", ErrLost, rec.Owner, rec.Version), false)
				default:
					m.log.Warn("authoritative read still names us; keeping the lease until the local deadline")
				}
			}
		}
		timer.Reset(m.renewDelay(deadline))
	}
}

// stepDown ends a tenure in three bounded phases: (1) close the source,
// bounded by min(5s, step_down_grace); (2) settlement grace: wait up to
// step_down_grace for OnOwner to return, then end the tenure; (3) release
// the lease, bounded by min(5s, step_down_grace), best effort. A tenure that
// is already invalid (deadline passed, lease lost) ends at once; the grace
// is skipped because the owner may no longer act.
func (m *Manager) stepDown(o *Ownership, workDone <-chan struct{}, reason string, cause error, release bool) error {
	c := m.cfg.Cadence
	tok := o.Token()
	phase := c.StepDownPhaseBound()
	lost := reason == ReasonDeadline || reason == ReasonLost || reason == ReasonRenewFailures
	if cause == nil {
		cause = errors.New("lease: stepping down: " + reason)
	}
	if lost {
		o.end(cause)
		m.log.Warn("lease lost; stopped acting", "reason", reason, "version", tok.Version, "err", cause)
		m.emit(Event{Kind: EventLost, Token: tok, Reason: reason, Err: cause})
	} else {
		o.stop()
		m.log.Info("stepping down", "reason", reason, "version", tok.Version)
	}
	m.met.isOwner.WithLabelValues(m.cfg.Session).Set(0)
	m.met.stepDowns.WithLabelValues(m.cfg.Session, reason).Inc()

	// Phase 1: close the source.
	if m.cfg.CloseSource != nil {
		if _, err := bounded(context.Background(), phase, "close source", func(cctx context.Context) (struct{}, error) {
			return struct{}{}, m.cfg.CloseSource(cctx)
		}); err != nil {
			m.log.Warn("closing the source failed", "err", err)
		}
	}
	// Phase 2: settlement grace. A tenure that is still valid gives the
	// work up to step_down_grace to settle, cut short by the local
	// deadline; a lost one only waits (bounded) for the cancelled work to
	// return.
	grace, deadline := c.StepDownGrace, o.Context().Done()
	if lost {
		grace, deadline = phase, nil
	}
	t := time.NewTimer(grace)
	select {
	case <-workDone:
	case <-deadline:
	case <-t.C:
	}
	t.Stop()
	o.end(cause)
	m.mu.Lock()
	m.current = nil
	m.mu.Unlock()
	m.emit(Event{Kind: EventSteppedDown, Token: tok, Reason: reason, Err: cause})

	// Phase 3: release, bounded, best effort.
	if release {
		_, err := bounded(context.Background(), phase, "release", func(rctx context.Context) (struct{}, error) {
			return struct{}{}, m.cfg.Store.Release(rctx, m.cfg.Session, tok)
		})
		if err != nil {
			m.log.Warn("lease release failed; standbys will wait out the lease by observation", "version", tok.Version, "err", err)
			m.emit(Event{Kind: EventReleased, Token: tok, Reason: reason, Err: err})
		} else {
			m.log.Info("lease released", "version", tok.Version)
			m.emit(Event{Kind: EventReleased, Token: tok, Reason: reason})
		}
	}
	if reason == ReasonDependency {
		m.log.Error("stepped down because the dependency path stayed unhealthy; this manager will not compete for the lease again",
			"dependency_step_down", m.cfg.DependencyStepDown)
		return ErrDependencyStepDown
	}
	return nil
}

// ErrCallAbandoned is wrapped by the error of a store call or CloseSource
// that did not return within its bound: the manager stopped waiting for it
// and treats its outcome as unknown (a transient failure).
var ErrCallAbandoned = errors.New("lease: call abandoned at its time bound")

// bounded runs f with a context that ends after d and returns when f
// returns or d has passed, whichever comes first. Every wait the failover
// budgets count is bounded this way, so the bound holds even for a Store or
// a CloseSource that overruns its context: such a call is abandoned (its
// goroutine ends when f returns; its result is discarded) and reported as
// an error wrapping ErrCallAbandoned and the context's error.
func bounded[T any](ctx context.Context, d time.Duration, what string, f func(context.Context) (T, error)) (T, error) {
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := f(cctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-cctx.Done():
	}
	select {
	case r := <-done: // returned at the bound
		return r.v, r.err
	default:
	}
	var zero T
	return zero, fmt.Errorf("%w: %s did not return within %v: %w", ErrCallAbandoned, what, d, context.Cause(cctx))
}
