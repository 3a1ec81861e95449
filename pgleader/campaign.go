package pgleader

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The campaign: a follower takes the lock and starts a new term.

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
	if _, err := conn.Exec(cctx, registryUpsertSelf, e.cfg.ID, e.cfg.Host, e.cfg.Version, e.started, false, e.cfg.LockKey); err != nil {
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
	// drop closes the lock session after a failure and waits one retry
	// before the next session tries again (without waiting on the lock).
	drop := func(msg string, err error) {
		if ctx.Err() == nil {
			e.log.Warn(msg, "error", err)
		}
		if s != nil {
			s.hardClose()
			s = nil
			e.lockPID.Store(0)
		}
		sleepCtx(ctx, e.retryDelay())
		wait = 0
	}
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
				drop("opening the lock session failed", err)
				continue
			}
		}
		got, err := e.tryLock(ctx, s, wait)
		if err != nil {
			drop("lock attempt failed", err)
			continue
		}
		if got {
			term, err := e.startTerm(ctx, s)
			if err != nil {
				drop("starting a term failed; giving the lock back", err)
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
	if errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "57014") {
		// lock_not_available: the wait ran out. query_canceled: someone
		// cancelled the wait (pg_cancel_backend); the session is usable.
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
	sent := e.clock.Now()
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
	if _, err := s.conn.Exec(qctx, confirmSQL, e.cfg.ID, true, e.cfg.LockKey); err != nil {
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
