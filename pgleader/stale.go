package pgleader

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Ending the lock session of a frozen leader.

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
		JOIN `+RegistryTable+` r ON r.lock_pid = l.pid AND r.lock_key = $1
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
