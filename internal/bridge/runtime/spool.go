package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/outbox"
	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/spool"
)

// SpoolStatus is one route's durable spool in /status.
type SpoolStatus struct {
	Route string `json:"route"`
	// Backend is "file" or "postgres".
	Backend string `json:"backend"`
	// Dir is the file spool's directory.
	Dir string `json:"dir,omitempty"`
	// Table is the postgres spool's table, LeaseVersion the fencing
	// version its rows are claimed and settled under.
	Table        string `json:"table,omitempty"`
	LeaseVersion int64  `json:"lease_version,omitempty"`
	spool.Stats
}

// spoolOpenTimeout bounds the wait for a spool that a route added by a
// reload opens (its lock is held by nobody else on a healthy host).
const spoolOpenTimeout = 10 * time.Second

// spoolLockWarnAfter is how long a spool's lock is waited for before the
// wait is logged.
const spoolLockWarnAfter = time.Second

// tenureOutboxes are the open postgres spools (package outbox) of the
// tenures, by tenure and route. They are kept here rather than in
// tenure.spools, whose type is the file spool's; guarded by outboxMu, and
// read or written together with tenure.spoolsClosed under the runner's mu.
var (
	outboxMu       sync.Mutex
	tenureOutboxes = map[*tenure]map[string]*outbox.Outbox{}
)

func outboxOf(t *tenure, route string) *outbox.Outbox {
	outboxMu.Lock()
	defer outboxMu.Unlock()
	return tenureOutboxes[t][route]
}

// openSpools opens the spool of every route that has one, for the
// tenure: a spool is held (a file spool's directory locked, an outbox
// fenced at the tenure's lease version) only while this instance serves
// the session, so that a successor opens it when this one let go of it,
// died, or (outbox) was deposed. ctx bounds the wait.
func (r *runner) openSpools(ctx context.Context, t *tenure, cfg *config.Config, routes []config.RouteSettings) error {
	for _, rt := range routes {
		if rt.Spool == nil {
			continue
		}
		if _, err := r.openSpool(ctx, t, rt); err != nil {
			return err
		}
	}
	return nil
}

func (r *runner) openSpool(ctx context.Context, t *tenure, rt config.RouteSettings) (routing.Spool, error) {
	if rt.Spool.Backend == config.SpoolPostgres {
		return r.openOutbox(ctx, t, rt)
	}
	r.mu.Lock()
	sp, ended := t.spools[rt.ID], t.spoolsClosed
	r.mu.Unlock()
	if ended {
		return nil, fmt.Errorf("route %q: the tenure ended", rt.ID)
	}
	if sp != nil {
		return sp, nil
	}
	c := rt.Spool
	id := rt.ID
	// Open waits for the directory's lock: say so when that lasts (a
	// frozen predecessor, or another process configured with the same
	// directory), since meanwhile the session is held but not served.
	opened := make(chan struct{})
	waitLog := make(chan struct{})
	go func() {
		defer close(waitLog)
		select {
		case <-time.After(spoolLockWarnAfter):
			r.log.Warn("waiting for the spool's lock: another process holds its directory; the session is not served until it lets go", "route", id, "dir", c.Dir)
		case <-opened:
		}
	}()
	sp, err := spool.Open(ctx, spool.Options{Dir: c.Dir, MaxBytes: int64(c.MaxBytes), MaxMessages: int64(c.MaxMessages), Full: c.Full,
		Fsync: c.Fsync, FsyncInterval: c.FsyncInterval, SegmentBytes: int64(c.SegmentBytes), OnStats: r.spoolStats(id)})
	close(opened)
	<-waitLog
	if err != nil {
		return nil, fmt.Errorf("route %q: %w", rt.ID, err)
	}
	if st := sp.Stats(); st.Recovered > 0 || st.TruncatedBytes > 0 {
		r.log.Info("spool opened with messages to deliver", "route", rt.ID, "dir", c.Dir, "messages", st.Recovered, "torn_tail_bytes", st.TruncatedBytes)
	}
	r.mu.Lock()
	if t.spoolsClosed {
		// The tenure ended while this one opened (a reload's late build).
		r.mu.Unlock()
		_ = sp.Close()
		return nil, fmt.Errorf("route %q: the tenure ended", rt.ID)
	}
	if t.spools == nil {
		t.spools = map[string]*spool.Spool{}
	}
	t.spools[rt.ID] = sp
	r.mu.Unlock()
	return sp, nil
}

// spoolStats feeds the spool metrics of route id.
func (r *runner) spoolStats(id string) func(spool.Stats) {
	met := r.b.met
	return func(st spool.Stats) {
		met.SpoolMessages.WithLabelValues(id).Set(float64(st.Messages))
		met.SpoolBytes.WithLabelValues(id).Set(float64(st.Bytes))
		met.SpoolOldestAge.WithLabelValues(id).Set(st.OldestAgeS)
	}
}

// openOutbox opens the postgres spool of route rt for the tenure, fenced
// at the tenure's lease version, on its own small pool of the lease
// store's database (closed with the outbox).
func (r *runner) openOutbox(ctx context.Context, t *tenure, rt config.RouteSettings) (routing.Spool, error) {
	r.mu.Lock()
	ended, cfg := t.spoolsClosed, r.cfg
	r.mu.Unlock()
	if ended {
		return nil, fmt.Errorf("route %q: the tenure ended", rt.ID)
	}
	if ob := outboxOf(t, rt.ID); ob != nil {
		return ob, nil
	}
	if t.own == nil || r.manager == nil {
		// Validation refuses it; a programming error if it gets here.
		return nil, fmt.Errorf("route %q: spool backend postgres needs an exclusive session", rt.ID)
	}
	tok := t.own.Token()
	pool, err := outbox.OpenPool(ctx, cfg.LeaseStore.DSN.Reveal())
	if err != nil {
		return nil, fmt.Errorf("route %q: %w", rt.ID, err)
	}
	c := rt.Spool
	ob, err := outbox.Open(ctx, outbox.Options{Pool: pool, OwnPool: true, Lease: r.manager.Session(), Owner: tok.Owner, Version: tok.Version,
		Route: rt.ID, MaxBytes: int64(c.MaxBytes), MaxMessages: int64(c.MaxMessages), Full: c.Full,
		OnStats: r.spoolStats(rt.ID), Valid: t.own.Valid, Logger: r.log,
		OnFenced: func(err error) { r.outboxFenced(t, rt.ID, err) }})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("route %q: %w", rt.ID, err)
	}
	if st := ob.Stats(); st.Recovered > 0 {
		r.log.Info("spool opened with messages to deliver", "route", rt.ID, "backend", config.SpoolPostgres, "messages", st.Recovered, "lease_version", tok.Version)
	}
	r.mu.Lock()
	if t.spoolsClosed {
		r.mu.Unlock()
		_ = ob.Close()
		return nil, fmt.Errorf("route %q: the tenure ended", rt.ID)
	}
	outboxMu.Lock()
	if tenureOutboxes[t] == nil {
		tenureOutboxes[t] = map[string]*outbox.Outbox{}
	}
	tenureOutboxes[t][rt.ID] = ob
	outboxMu.Unlock()
	r.mu.Unlock()
	return ob, nil
}

// outboxFenced ends what the tenure takes in: a newer owner took the
// session's outbox over (or this tenure's lease deadline passed), so the
// tenure is over. The source's intake stops (what it delivered and the
// outbox refused stays unacknowledged at the broker, for the successor);
// the lease manager ends the tenure at its next renew, which the
// successor's version refuses.
func (r *runner) outboxFenced(t *tenure, route string, err error) {
	r.log.Error("spool fenced: this instance is no longer the session's owner; it stops taking messages and leaves the outbox to the successor",
		"route", route, "err", err, "tenure_ended", errors.Is(err, outbox.ErrTenureEnded))
	r.mu.Lock()
	s := t.session
	r.mu.Unlock()
	if s != nil {
		s.Drain()
	}
}

// spoolFor is the route's spool for buildRoutes (nil without one). A
// route that a reload added opens its spool here; if that fails the
// route runs without it, and says so.
func (r *runner) spoolFor(t *tenure, rt config.RouteSettings) routing.Spool {
	if rt.Spool == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), spoolOpenTimeout)
	defer cancel()
	sp, err := r.openSpool(ctx, t, rt)
	if err != nil {
		// Without its spool the route still delivers at least once, as
		// long as the source broker holds what it did not acknowledge.
		r.log.Error("spool could not be opened; the route runs without it until the next restart", "route", rt.ID, "err", err)
		return nil
	}
	return sp
}

// closeSpools closes the tenure's spools, after its routes closed.
func (r *runner) closeSpools(t *tenure) {
	r.mu.Lock()
	sps := t.spools
	t.spools, t.spoolsClosed = nil, true
	outboxMu.Lock()
	obs := tenureOutboxes[t]
	delete(tenureOutboxes, t)
	outboxMu.Unlock()
	r.mu.Unlock()
	for id, sp := range sps {
		if err := sp.Close(); err != nil {
			r.log.Error("spool close", "route", id, "err", err)
		}
	}
	for id, ob := range obs {
		if err := ob.Close(); err != nil {
			r.log.Error("spool close", "route", id, "backend", config.SpoolPostgres, "err", err)
		}
	}
}

// spoolStatus reports the tenure's spools; with r.mu held.
func spoolStatus(t *tenure) []SpoolStatus {
	var out []SpoolStatus
	for id, sp := range t.spools {
		out = append(out, SpoolStatus{Route: id, Backend: config.SpoolFile, Dir: sp.Dir(), Stats: sp.Stats()})
	}
	outboxMu.Lock()
	defer outboxMu.Unlock()
	for id, ob := range tenureOutboxes[t] {
		var v int64
		if t.own != nil {
			v = t.own.Token().Version
		}
		out = append(out, SpoolStatus{Route: id, Backend: config.SpoolPostgres, Table: outbox.Table, LeaseVersion: v, Stats: ob.Stats()})
	}
	return out
}
