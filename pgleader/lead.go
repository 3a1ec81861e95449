package pgleader

import (
	"context"
	"errors"
	"time"
)

// The lead loop of one term: confirmations on the lock session, the
// watchdog that ends the leader context at the latest T/2 after the last
// answer, resignation and the planned-stop release.

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
		if left := e.lastAnswer.Add(e.k.ResignAfter).Sub(e.clock.Now()); left > 0 {
			watchdog.Reset(left)
			return
		}
		lcancel(errConfirmTimeout)
	}
	e.mu.Lock()
	e.leader, e.term, e.leaderCtx = true, term, lctx
	watchdog = time.AfterFunc(e.lastAnswer.Add(e.k.ResignAfter).Sub(e.clock.Now()), expire)
	// The metrics change under the same lock that publishes the term, so
	// that whoever sees the new term also sees it counted.
	e.m.leader.Set(1)
	e.m.term.Set(float64(term))
	e.m.elections.Inc()
	e.mu.Unlock()
	defer watchdog.Stop()
	e.log.Info("elected leader", "term", term, "lock_pid", s.pid)
	if e.cfg.OnElected != nil {
		e.cfg.OnElected(&Leadership{e: e, ctx: lctx, term: term})
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
		select {
		case <-ctx.Done():
			reason = ReasonStop
			break loop
		case <-lctx.Done():
			reason = ReasonConfirmTimeout
			break loop
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
				watchdog.Reset(r.sent.Add(e.k.ResignAfter).Sub(e.clock.Now()))
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
	e.m.leader.Set(0)
	e.m.resignations.WithLabelValues(reason).Inc()
	e.mu.Unlock()
	lcancel(errResigned)
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
const confirmSQL = `WITH r AS (SELECT id FROM ` + RegistryTable + ` WHERE id = $1 AND lock_key = $3 FOR UPDATE SKIP LOCKED)
	UPDATE ` + RegistryTable + ` t SET last_heartbeat = now(), is_leader = $2, lock_pid = CASE WHEN $2 THEN pg_backend_pid() END
	FROM r WHERE t.id = r.id AND t.lock_key = $3`

func (e *Elector) confirm(ctx context.Context, s *session) confirmResult {
	sent := e.clock.Now()
	qctx, cancel := context.WithTimeout(ctx, e.k.ConfirmTimeout)
	defer cancel()
	_, err := s.conn.Exec(qctx, confirmSQL, e.cfg.ID, true, e.cfg.LockKey)
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
	_, _ = s.conn.Exec(ctx, confirmSQL, e.cfg.ID, false, e.cfg.LockKey)
	if err := s.conn.Close(ctx); err != nil {
		s.hardClose()
	}
	e.log.Info("released leadership", "took", time.Since(start))
}
