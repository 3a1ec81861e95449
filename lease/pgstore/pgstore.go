// Package pgstore is the PostgreSQL lease store, for clusters.
//
// It works behind an ordinary pgx connection pool (no session state, no
// advisory locks held between calls): every compare-and-set is one UPDATE
// or INSERT statement guarded by the row's observation sequence number.
// Open creates or migrates its schema under a transaction-scoped advisory
// lock, so many processes may start at once.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/internal/rowstore"
)

// Options tune a store. The zero value is usable.
type Options struct {
	// Clock is the store's monotonic clock; nil means lease.SystemClock.
	Clock lease.Clock
}

// SchemaVersion is the schema this package creates and migrates to.
const SchemaVersion = 1

// schemaLockKey is the advisory lock key that serializes migrations
// ("myriarch-lease-schema").
const schemaLockKey int64 = 0x6d796c656173650a

var migrations = []string{
	// 1: the lease table. Rows are never deleted.
	`CREATE TABLE IF NOT EXISTS myriarch_leases (
		id             text PRIMARY KEY,
		owner          text NOT NULL,
		version        bigint NOT NULL,
		renewed_at_ns  bigint NOT NULL,
		expiry_ns      bigint NOT NULL,
		endpoint       text NOT NULL,
		obs_seq        bigint NOT NULL,
		obs_elapsed_ns bigint NOT NULL
	)`,
}

// Open returns a store on pool after creating or migrating the schema. The
// store does not close pool. The pool's sessions must not run with
// synchronous_commit off: a lease write that PostgreSQL acknowledged and
// then lost in a crash would let a fencing version be granted twice, so
// Open refuses such a pool.
func Open(ctx context.Context, pool *pgxpool.Pool, opts Options) (lease.Store, error) {
	var sc string
	if err := pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sc); err != nil {
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	if sc == "off" {
		return nil, errors.New("pgstore: synchronous_commit is off for this pool's sessions; lease writes must be durable when acknowledged (set it to on, e.g. as a connection runtime parameter)")
	}
	if err := Migrate(ctx, pool); err != nil {
		return nil, err
	}
	return rowstore.New(&backend{pool: pool}, opts.Clock), nil
}

// OpenDSN opens a pool on dsn and a store on it; closing the store closes
// the pool. The pool's sessions run with synchronous_commit on, whatever
// the server default, so an acknowledged lease write survives a server
// crash.
func OpenDSN(ctx context.Context, dsn string, opts Options) (lease.Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	s, err := Open(ctx, pool, opts)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.(*rowstore.Store).Backend().(*backend).own = true
	return s, nil
}

// Migrate creates or migrates the lease schema, one process at a time.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", schemaLockKey); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS myriarch_lease_schema (version integer NOT NULL)`); err != nil {
			return err
		}
		var v int
		err := tx.QueryRow(ctx, "SELECT version FROM myriarch_lease_schema").Scan(&v)
		if errors.Is(err, pgx.ErrNoRows) {
			if _, err := tx.Exec(ctx, "INSERT INTO myriarch_lease_schema (version) VALUES (0)"); err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
		if v > SchemaVersion {
			return fmt.Errorf("schema version %d is newer than this build's %d; refusing to use it", v, SchemaVersion)
		}
		for i := v; i < SchemaVersion; i++ {
			if _, err := tx.Exec(ctx, migrations[i]); err != nil {
				return fmt.Errorf("migration %d: %w", i+1, err)
			}
		}
		_, err = tx.Exec(ctx, "UPDATE myriarch_lease_schema SET version = $1", SchemaVersion)
		return err
	})
	if err != nil {
		return fmt.Errorf("pgstore: schema: %w", err)
	}
	return nil
}

type backend struct {
	pool *pgxpool.Pool
	own  bool
}

func (b *backend) Load(ctx context.Context, id string) (rowstore.Row, int64, bool, error) {
	return rowstore.Scan(b.pool.QueryRow(ctx, "SELECT "+rowstore.Columns+" FROM myriarch_leases WHERE id = $1", id).Scan, pgx.ErrNoRows, "pgstore", id)
}

func (b *backend) Insert(ctx context.Context, id string, r rowstore.Row) (bool, error) {
	tag, err := b.pool.Exec(ctx, "INSERT INTO myriarch_leases ("+rowstore.Columns+", id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (id) DO NOTHING",
		r.Values(id)...)
	if err != nil {
		return false, fmt.Errorf("pgstore: insert %q: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

const casSQL = `UPDATE myriarch_leases SET owner = $1, version = $2, renewed_at_ns = $3, expiry_ns = $4,
		endpoint = $5, obs_seq = $6, obs_elapsed_ns = $7 WHERE id = $8 AND obs_seq = $9`

// ReleaseChannel is the NOTIFY channel of releases; the payload is the
// lease id. A release notifies in the same statement (so at its commit),
// which keeps it one call.
const ReleaseChannel = "myriarch_lease_released"

func (b *backend) CAS(ctx context.Context, id string, rev int64, r rowstore.Row) (bool, error) {
	args := r.Values(id, rev)
	if r.Owner == "" {
		var n int64
		err := b.pool.QueryRow(ctx, `WITH u AS (`+casSQL+` RETURNING id)
			SELECT count(*) FROM (SELECT pg_notify('`+ReleaseChannel+`', id) FROM u) n`, args...).Scan(&n)
		if err != nil {
			return false, fmt.Errorf("pgstore: release %q: %w", id, err)
		}
		return n == 1, nil
	}
	tag, err := b.pool.Exec(ctx, casSQL, args...)
	if err != nil {
		return false, fmt.Errorf("pgstore: update %q: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Watch implements rowstore.Watcher: one LISTEN session per process (its
// own connection, outside the pool) for all the standbys.
func (b *backend) Watch(ctx context.Context, released func(id string)) {
	for ctx.Err() == nil {
		b.listen(ctx, released)
		// Reconnect after a pause; releases meanwhile are found by the
		// standby's poll.
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (b *backend) listen(ctx context.Context, released func(id string)) {
	conn, err := pgx.ConnectConfig(ctx, b.pool.Config().ConnConfig.Copy())
	if err != nil {
		return
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+ReleaseChannel); err != nil {
		return
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return
		}
		released(n.Payload)
	}
}

func (b *backend) Close() error {
	if b.own {
		b.pool.Close()
	}
	return nil
}
