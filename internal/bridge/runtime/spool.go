package runtime

import (
	"context"
	"fmt"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/spool"
)

// SpoolStatus is one route's durable spool in /status.
type SpoolStatus struct {
	Route string `json:"route"`
	Dir   string `json:"dir"`
	spool.Stats
}

// spoolOpenTimeout bounds the wait for a spool that a route added by a
// reload opens (its lock is held by nobody else on a healthy host).
const spoolOpenTimeout = 10 * time.Second

// spoolLockWarnAfter is how long a spool's lock is waited for before the
// wait is logged.
const spoolLockWarnAfter = time.Second

// openSpools opens the spool of every route that has one, for the
// tenure: a spool is held (its directory locked) only while this instance
// serves the session, so that a successor on the same host opens it when
// this one let go of it or died. ctx bounds the wait for the lock.
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

func (r *runner) openSpool(ctx context.Context, t *tenure, rt config.RouteSettings) (*spool.Spool, error) {
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
	met := r.b.met
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
		Fsync: c.Fsync, FsyncInterval: c.FsyncInterval, SegmentBytes: int64(c.SegmentBytes),
		OnStats: func(st spool.Stats) {
			met.SpoolMessages.WithLabelValues(id).Set(float64(st.Messages))
			met.SpoolBytes.WithLabelValues(id).Set(float64(st.Bytes))
			met.SpoolOldestAge.WithLabelValues(id).Set(st.OldestAgeS)
		}})
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
	r.mu.Unlock()
	for id, sp := range sps {
		if err := sp.Close(); err != nil {
			r.log.Error("spool close", "route", id, "err", err)
		}
	}
}

// spoolStatus reports the tenure's spools; with r.mu held.
func spoolStatus(t *tenure) []SpoolStatus {
	var out []SpoolStatus
	for id, sp := range t.spools {
		out = append(out, SpoolStatus{Route: id, Dir: sp.Dir(), Stats: sp.Stats()})
	}
	return out
}
