package runtime

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/transport"
)

// ErrNotRunning is returned by Reload before Run or after Run began to
// stop.
var ErrNotRunning = errors.New("bridge: not running")

// Config returns the configuration the bridge runs now.
func (b *Bridge) Config() *config.Config {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cfg
}

// Reload moves the running bridge to cfg, a validated configuration (see
// config.Compare for what makes a session kept or changed):
//
//   - a kept session keeps its lease and its broker connection: its routes
//     are swapped under the running tenure, the old routes finish what
//     they hold (within shutdown_timeout) before they close;
//   - a changed session stops like at shutdown (an exclusive one drains
//     and releases its lease) and starts again from the new settings, as
//     a standby that competes for the lease;
//   - a removed session stops; an added one starts;
//   - senders that are new or changed are opened before anything stops,
//     and the ones they replace are closed after the routes using them.
//
// Nothing is changed when cfg changes a setting that takes a restart
// (config.Problems) or when a sender or a lease manager cannot be set up.
// Filters a session no longer subscribes are unsubscribed by its next
// connection, which a subscription change causes (the session changes).
func (b *Bridge) Reload(ctx context.Context, cfg *config.Config) (config.Diff, error) {
	b.reloadMu.Lock()
	defer b.reloadMu.Unlock()
	b.mu.Lock()
	old, running := b.cfg, b.runCtx != nil && !b.stopped && b.runCtx.Err() == nil
	b.mu.Unlock()
	if !running {
		return config.Diff{}, ErrNotRunning
	}
	d, ps := config.Compare(old, cfg)
	if len(ps) > 0 {
		return d, ps
	}

	// Everything that can fail comes first.
	opened := map[string]sender.Sender{}
	closeOpened := func() {
		for _, s := range opened {
			_ = s.Close(ctx)
		}
	}
	for _, id := range d.SendersChanged {
		snd, err := openSender(*cfg.Sender(id), b.instanceID, b.log.With("sender", id))
		if err != nil {
			closeOpened()
			return d, fmt.Errorf("sender %q: %w", id, err)
		}
		opened[id] = snd
	}
	if b.store == nil && len(cfg.Exclusive) > 0 {
		st, err := openStore(ctx, cfg.LeaseStore)
		if err != nil {
			closeOpened()
			return d, fmt.Errorf("lease store (%s): %w", cfg.LeaseStore.Type, err)
		}
		b.store = st
	}
	// A changed session this process owns is handed to a standby (the
	// planned-stop path) rather than won back by the new runner at once.
	owned := map[string]bool{}
	b.mu.Lock()
	current := slices.Clone(b.runners)
	b.mu.Unlock()
	for _, r := range current {
		r.mu.Lock()
		owned[r.sess.ID] = r.role == "owner"
		r.mu.Unlock()
	}
	fresh := map[string]*runner{}
	for _, id := range slices.Concat(d.Added, d.Changed) {
		r, err := b.newRunnerYield(cfg, cfg.Session(id), owned[id] && slices.Contains(d.Changed, id))
		if err != nil {
			closeOpened()
			return d, fmt.Errorf("session %q: %w", id, err)
		}
		fresh[id] = r
	}
	b.log.Info("reloading the configuration", "file", cfg.File, "kept", d.Kept, "changed", d.Changed, "added", d.Added,
		"removed", d.Removed, "senders_changed", d.SendersChanged, "senders_removed", d.SendersRemoved)

	// Stop the removed and changed sessions, all at once.
	b.mu.Lock()
	byID := map[string]*runner{}
	for _, r := range b.runners {
		byID[r.sess.ID] = r
	}
	b.mu.Unlock()
	var wg sync.WaitGroup
	for _, id := range slices.Concat(d.Removed, d.Changed) {
		if r := byID[id]; r != nil {
			wg.Go(r.stop)
		}
	}
	wg.Wait()

	// Switch: the new configuration, the sender set, the runners.
	b.mu.Lock()
	retired := map[string]sender.Sender{}
	senders := map[string]sender.Sender{}
	for id, s := range b.senders {
		if _, replaced := opened[id]; replaced || cfg.Sender(id) == nil {
			retired[id] = s
			continue
		}
		senders[id] = s
	}
	for id, s := range opened {
		senders[id] = s
	}
	b.cfg, b.senders = cfg, senders
	var runners []*runner
	for _, s := range cfg.Sessions {
		if r := fresh[s.ID]; r != nil {
			runners = append(runners, r)
			b.startLocked(r)
		} else {
			runners = append(runners, byID[s.ID])
		}
	}
	b.runners = runners
	b.mu.Unlock()

	// Kept sessions take their new routes.
	for _, id := range d.Kept {
		r := byID[id]
		if sameRoutes(old, cfg, id, d.SendersChanged) {
			r.mu.Lock()
			r.cfg, r.routes = cfg, sessionRoutes(cfg, id)
			r.mu.Unlock()
			continue
		}
		wg.Go(func() { r.update(ctx, cfg) })
	}
	wg.Wait()
	for id, s := range retired {
		if err := s.Close(ctx); err != nil {
			b.log.Warn("closing a replaced sender", "sender", id, "err", err)
		}
	}
	return d, nil
}

// sameRoutes reports whether session id has the same routes in both
// configurations, using none of the changed senders.
func sameRoutes(old, cur *config.Config, id string, changedSenders []string) bool {
	a, b := sessionRoutes(old, id), sessionRoutes(cur, id)
	if !reflect.DeepEqual(a, b) {
		return false
	}
	for _, rt := range b {
		for _, s := range rt.Senders {
			if slices.Contains(changedSenders, s) {
				return false
			}
		}
	}
	return true
}

// sessionRoutes is every route of session id, in configuration order.
func sessionRoutes(cfg *config.Config, id string) []config.RouteSettings {
	var out []config.RouteSettings
	for _, rt := range cfg.Routes {
		if rt.Session == id {
			out = append(out, rt)
		}
	}
	return out
}

// update gives a kept session the routes of cfg: the next tenure builds
// them, and the running one, if any, swaps them in.
func (r *runner) update(ctx context.Context, cfg *config.Config) {
	r.mu.Lock()
	r.cfg, r.routes = cfg, sessionRoutes(cfg, r.sess.ID)
	r.gen++
	t := r.cur
	r.mu.Unlock()
	if t != nil {
		r.refresh(ctx, t)
	}
}

// refresh swaps the routes of tenure t for ones built from r.cfg, lets the
// old ones finish what they hold and closes them.
func (r *runner) refresh(ctx context.Context, t *tenure) {
	r.mu.Lock()
	cfg, routes, disp := r.cfg, r.routes, t.disp
	r.mu.Unlock()
	if disp == nil {
		return // serve has not built its routes yet; it will see r.gen
	}
	fresh := r.buildRoutes(cfg, routes, t)
	old, ok := disp.swap(fresh)
	if !ok {
		// The tenure ended meanwhile; the next one builds from r.cfg.
		for _, rt := range fresh {
			rt.Close()
		}
		return
	}
	wctx, cancel := context.WithTimeout(ctx, cfg.Bridge.ShutdownTimeout)
	defer cancel()
	for _, rt := range old {
		if err := rt.WaitIdle(wctx); err != nil {
			r.log.Warn("reload: a replaced route's in-flight messages are left unacknowledged", "route", rt.ID(), "in_flight", rt.InFlight())
		}
		rt.Close()
	}
	r.log.Info("routes replaced without reconnecting", "routes", len(fresh))
}

// buildRoutes builds a tenure's routes from cfg with the current senders.
func (r *runner) buildRoutes(cfg *config.Config, settings []config.RouteSettings, t *tenure) []*routing.Route {
	r.b.mu.Lock()
	senders := r.b.senders
	r.b.mu.Unlock()
	var routes []*routing.Route
	for _, rt := range settings {
		recv := cfg.Receiver(rt.Receiver)
		var filters []string
		for _, t := range recv.Topics {
			filters = append(filters, t.Filter)
		}
		var targets []routing.Target
		for _, id := range rt.Senders {
			st := cfg.Sender(id)
			targets = append(targets, routing.Target{ID: id, Sender: senders[id], MaxAttempts: st.MaxAttempts,
				InitialBackoff: st.InitialBackoff, MaxBackoff: st.MaxBackoff})
		}
		routes = append(routes, routing.NewRoute(routing.RouteConfig{ID: rt.ID, Filters: filters, Targets: targets,
			MaxInFlight: rt.MaxInFlight, StripPrefix: rt.StripPrefix, AddPrefix: rt.AddPrefix, Retain: routing.RetainPolicy(rt.Retain), Mappings: mappings(rt.Mappings), LoopPeer: rt.LoopPeer, DeadLetter: r.b.dl,
			Metrics: r.b.met, Logger: r.log, Fence: t.stamp, Tenure: t.guard, Spool: r.spoolFor(t, rt)}))
	}
	return routes
}

// liveDispatcher is a tenure's message handler whose routes a reload can
// replace while the transport stays connected.
type liveDispatcher struct {
	// mu is held for reading while a message is handed to the routes, so
	// that a swap knows when no message can still reach the old ones.
	mu  sync.RWMutex
	cur atomic.Pointer[routing.Dispatcher]
	// smu guards retired and the store of cur against retire, which must
	// not wait for a handler (it may be blocked on a full route that only
	// the retiring tenure's Close unblocks).
	smu     sync.Mutex
	retired bool
}

// Handle implements transport.Handler.
func (l *liveDispatcher) Handle(m *transport.Message, ack func()) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	l.cur.Load().Handle(m, ack)
}

func (l *liveDispatcher) routes() []*routing.Route { return l.cur.Load().Routes }

// swap installs routes and returns the ones they replace, which no handler
// uses any more; false if the tenure was retired (routes are not used).
func (l *liveDispatcher) swap(routes []*routing.Route) ([]*routing.Route, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.smu.Lock()
	defer l.smu.Unlock()
	if l.retired {
		return nil, false
	}
	old := l.cur.Load()
	l.cur.Store(&routing.Dispatcher{Session: old.Session, Routes: routes, Metrics: old.Metrics})
	return old.Routes, true
}

// retire ends the tenure's routing and returns the routes to close.
func (l *liveDispatcher) retire() []*routing.Route {
	l.smu.Lock()
	defer l.smu.Unlock()
	l.retired = true
	return l.cur.Load().Routes
}

var _ transport.Handler = (*liveDispatcher)(nil).Handle
