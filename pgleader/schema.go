package pgleader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Table names.
const (
	TermTable     = "myriarch_leader_term"
	RegistryTable = "myriarch_replicas"
)

// schemaLockKey serializes concurrent EnsureSchema calls (two-int4 advisory
// keys live apart from the single-bigint leader key).
const schemaLockA, schemaLockB = 0x4d59, 0x5047

var schemaSQL = `
CREATE TABLE IF NOT EXISTS ` + TermTable + ` (
	lock_key   bigint PRIMARY KEY,
	term       bigint NOT NULL,
	leader_id  text NOT NULL,
	lock_pid   integer NOT NULL,
	elected_at timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS ` + RegistryTable + ` (
	lock_key       bigint NOT NULL,
	id             text NOT NULL,
	host           text NOT NULL,
	version        text NOT NULL,
	started_at     timestamptz NOT NULL,
	last_heartbeat timestamptz NOT NULL,
	is_leader      boolean NOT NULL DEFAULT false,
	lock_pid       integer,
	PRIMARY KEY (lock_key, id)
);
CREATE INDEX IF NOT EXISTS ` + RegistryTable + `_lock_pid ON ` + RegistryTable + ` (lock_pid);
` + registryMigration

// registryMigration keys a registry table created before the registry had
// a lock key (primary key id alone): the existing rows are given the
// default key (the key of nearly every installation; rows of replicas with
// another key are written again, keyed, by their next heartbeat, and the
// old ones age out like any stale row), then the primary key becomes
// (lock_key, id). A no-op on a keyed table. Replicas of a version from
// before the key cannot write their row after the migration: upgrade all
// replicas of a database together (a rolling upgrade works: the new
// replicas take over).
var registryMigration = fmt.Sprintf(`
DO $$
BEGIN
	-- Only a table of the earlier layout is altered: on a keyed table this
	-- takes no lock beyond the catalog reads (an ALTER would lock the table
	-- against the leader's heartbeat on every start of a replica).
	IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('%[1]s') AND attname = 'lock_key' AND NOT attisdropped) THEN
		ALTER TABLE %[1]s ADD COLUMN lock_key bigint;
		UPDATE %[1]s SET lock_key = %[2]d;
		ALTER TABLE %[1]s ALTER COLUMN lock_key SET NOT NULL;
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
			WHERE i.indrelid = to_regclass('%[1]s') AND i.indisprimary AND a.attname = 'lock_key') THEN
		ALTER TABLE %[1]s DROP CONSTRAINT IF EXISTS %[1]s_pkey;
		ALTER TABLE %[1]s ADD PRIMARY KEY (lock_key, id);
	END IF;
END $$;
`, RegistryTable, DefaultLockKey)

// EnsureSchema creates the term and registry tables if they do not exist.
// Concurrent callers are serialized with a transaction-level advisory lock.
func EnsureSchema(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1::int4, $2::int4)", schemaLockA, schemaLockB); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, schemaSQL)
		return err
	})
}

// lockKeyWhere matches the granted advisory lock of key $1 in the current
// database in pg_locks aliased l. A single bigint key is stored as
// classid = high 32 bits, objid = low 32 bits, objsubid = 1.
const lockKeyWhere = `l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
	AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND l.classid::bigint = (($1::bigint >> 32) & 4294967295)
	AND l.objid::bigint = ($1::bigint & 4294967295)`

// CheckTerm verifies inside tx that term is the current term of lockKey and
// that the lock session that started it still holds the lock. It locks the
// term row FOR SHARE until tx ends, so a new leader cannot start a new term
// before tx has committed or rolled back. It returns a *StaleTermError
// (errors.Is(err, ErrStaleTerm)) when the term is no longer current.
func CheckTerm(ctx context.Context, tx pgx.Tx, lockKey, term int64) error {
	var cur int64
	var held bool
	err := tx.QueryRow(ctx, `SELECT t.term, EXISTS (SELECT 1 FROM pg_locks l WHERE `+lockKeyWhere+` AND l.pid = t.lock_pid)
		FROM `+TermTable+` t WHERE t.lock_key = $1 FOR SHARE OF t`, lockKey).Scan(&cur, &held)
	if errors.Is(err, pgx.ErrNoRows) {
		return &StaleTermError{Term: term, Reason: fmt.Sprintf("no term recorded for lock key %d", lockKey)}
	}
	if err != nil {
		return err
	}
	if cur != term {
		return &StaleTermError{Term: term, Current: cur, Reason: "a newer term started"}
	}
	if !held {
		return &StaleTermError{Term: term, Current: cur, Reason: fmt.Sprintf("its lock session no longer holds lock %d", lockKey)}
	}
	return nil
}

// DB runs the SQL of the table functions: a *pgxpool.Pool, a *pgx.Conn
// or a pgx.Tx (for example the fenced transaction of a leader job).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// TermRecord is the current term of a lock key as recorded in the term
// table.
type TermRecord struct {
	Term      int64
	LeaderID  string
	ElectedAt time.Time
	// LockPID is the backend pid of the lock session that started the term.
	LockPID int32
}

// CurrentTerm reads the term row of lockKey. ok is false while no leader
// was ever elected (also before EnsureSchema ran).
func CurrentTerm(ctx context.Context, db DB, lockKey int64) (r TermRecord, ok bool, err error) {
	err = db.QueryRow(ctx, `SELECT term, leader_id, elected_at, lock_pid FROM `+TermTable+` WHERE lock_key = $1`, lockKey).
		Scan(&r.Term, &r.LeaderID, &r.ElectedAt, &r.LockPID)
	var pgErr *pgconn.PgError
	if errors.Is(err, pgx.ErrNoRows) || (errors.As(err, &pgErr) && pgErr.Code == "42P01") {
		return r, false, nil
	}
	return r, err == nil, err
}

// TermCommitTime returns when the transaction that started term of lockKey
// committed, by the server's clock. It needs track_commit_timestamp = on
// and returns pgx.ErrNoRows when term is no longer the recorded one.
func TermCommitTime(ctx context.Context, db DB, lockKey, term int64) (time.Time, error) {
	var at time.Time
	err := db.QueryRow(ctx, `SELECT pg_xact_commit_timestamp(xmin) FROM `+TermTable+` WHERE lock_key = $1 AND term = $2`, lockKey, term).Scan(&at)
	return at, err
}

// Replica is one row of the replica registry.
type Replica struct {
	ID            string
	Host          string
	Version       string
	StartedAt     time.Time
	LastHeartbeat time.Time
	// Age is the time since LastHeartbeat by the database clock.
	Age time.Duration
	// IsLeader is what the replica last reported; HoldsLock is whether its
	// lock session holds the leader lock right now.
	IsLeader  bool
	HoldsLock bool
	// LockPID is the backend pid of its lock session (0: none).
	LockPID int32
	// Stale is true when the heartbeat is older than the staleness limit
	// given to ReadReplicas.
	Stale bool
}

// ReadReplicas lists the registry rows of lockKey, oldest first. Rows whose heartbeat is
// older than staleAfter are marked Stale; they stay until removed with
// PruneReplicas.
func ReadReplicas(ctx context.Context, db DB, lockKey int64, staleAfter time.Duration) ([]Replica, error) {
	rows, err := db.Query(ctx, `SELECT r.id, r.host, r.version, r.started_at, r.last_heartbeat,
			EXTRACT(EPOCH FROM now() - r.last_heartbeat)::float8, r.is_leader, coalesce(r.lock_pid, 0),
			EXISTS (SELECT 1 FROM pg_locks l WHERE `+lockKeyWhere+` AND l.pid = r.lock_pid)
		FROM `+RegistryTable+` r WHERE r.lock_key = $1 ORDER BY r.started_at, r.id`, lockKey)
	if err != nil {
		return nil, err
	}
	var out []Replica
	for rows.Next() {
		var r Replica
		var age float64
		if err := rows.Scan(&r.ID, &r.Host, &r.Version, &r.StartedAt, &r.LastHeartbeat, &age, &r.IsLeader, &r.LockPID, &r.HoldsLock); err != nil {
			return nil, err
		}
		r.Age = time.Duration(age * float64(time.Second))
		r.Stale = r.Age > staleAfter
		out = append(out, r)
	}
	return out, rows.Err()
}

// PruneReplicas deletes the registry rows of lockKey whose heartbeat is
// older than olderThan and returns how many it deleted. db may be the
// fenced transaction of a leader job.
func PruneReplicas(ctx context.Context, db DB, lockKey int64, olderThan time.Duration) (int64, error) {
	tag, err := db.Exec(ctx, `DELETE FROM `+RegistryTable+` WHERE lock_key = $1 AND last_heartbeat < now() - make_interval(secs => $2)`, lockKey, olderThan.Seconds())
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// registryUpsert writes the registry row; the %s are the parameter of the
// lock key, the lock pid and the new value of lock_pid on conflict.
const registryUpsert = `INSERT INTO ` + RegistryTable + ` AS r
	(lock_key, id, host, version, started_at, last_heartbeat, is_leader, lock_pid)
	VALUES (%s, $1, $2, $3, $4, now(), $5, %s)
	ON CONFLICT (lock_key, id) DO UPDATE SET host = EXCLUDED.host, version = EXCLUDED.version,
		started_at = EXCLUDED.started_at, last_heartbeat = EXCLUDED.last_heartbeat,
		is_leader = EXCLUDED.is_leader, lock_pid = %s`

var (
	// registryUpsertSelf runs on the lock session itself and records its
	// own pid: the lock session is the authority on lock_pid. $6 is the
	// lock key.
	registryUpsertSelf = fmt.Sprintf(registryUpsert, "$6", "pg_backend_pid()", "EXCLUDED.lock_pid")
	// registryUpsertParam is the heartbeat through the pool; $7 is the
	// lock key, $6 the lock pid the replica knew when it sent the write (NULL: none). That
	// snapshot may be older than the row: a heartbeat sent before the lock
	// session registered itself can commit after it. So it never replaces
	// the pid of a backend that is still alive; otherwise it would hide the
	// lock session from the followers' frozen-leader check until the next
	// confirmation.
	registryUpsertParam = fmt.Sprintf(registryUpsert, "$7", "$6", `CASE WHEN r.lock_pid IS NOT NULL
			AND r.lock_pid IS DISTINCT FROM EXCLUDED.lock_pid
			AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = r.lock_pid)
		THEN r.lock_pid ELSE EXCLUDED.lock_pid END`)
)

// isUserTimeoutRefusal reports whether a connection error is the server
// refusing the tcp_user_timeout startup parameter.
func isUserTimeoutRefusal(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return containsFold(pgErr.Message, "tcp_user_timeout") || containsFold(pgErr.Detail, "tcp_user_timeout")
}
