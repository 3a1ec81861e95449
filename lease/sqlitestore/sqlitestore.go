// Package sqlitestore is the embedded default lease store: one SQLite file
// that several processes on one host share safely.
//
// It is pure Go (modernc.org/sqlite). The file runs in WAL mode with a busy
// timeout, so processes wait for each other's short write locks instead of
// failing; every compare-and-set is one UPDATE or INSERT statement guarded
// by the row's observation sequence number. The file must live on a local
// file system (WAL needs shared memory; network file systems do not
// provide it).
package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"time"

	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/internal/rowstore"
	"modernc.org/sqlite" // registers the "sqlite" database/sql driver
	sqlite3 "modernc.org/sqlite/lib"
)

// Options tune a store. The zero value is usable.
type Options struct {
	// BusyTimeout is how long a statement waits for another process's
	// write lock; default 5s. A call's context still bounds it.
	BusyTimeout time.Duration
	// Clock is the store's monotonic clock; nil means lease.SystemClock.
	Clock lease.Clock
}

// SchemaVersion is the schema this package creates and migrates to
// (PRAGMA user_version).
const SchemaVersion = 1

var migrations = []string{
	// 1: the lease table. Rows are never deleted.
	`CREATE TABLE IF NOT EXISTS myriarch_leases (
		id             TEXT PRIMARY KEY NOT NULL,
		owner          TEXT NOT NULL,
		version        INTEGER NOT NULL,
		renewed_at_ns  INTEGER NOT NULL,
		expiry_ns      INTEGER NOT NULL,
		endpoint       TEXT NOT NULL,
		obs_seq        INTEGER NOT NULL,
		obs_elapsed_ns INTEGER NOT NULL
	) STRICT`,
}

// Open opens (creating if needed) the lease file at path and migrates its
// schema.
func Open(ctx context.Context, path string, opts Options) (lease.Store, error) {
	b, err := openBackend(ctx, path, opts)
	if err != nil {
		return nil, err
	}
	return rowstore.New(b, opts.Clock), nil
}

type backend struct{ db *sql.DB }

func dsn(path string, busy time.Duration) string {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busy.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)") // an acknowledged grant survives power loss, so versions are never reused
	q.Set("_txlock", "immediate")
	return "file:" + path + "?" + q.Encode()
}

func openBackend(ctx context.Context, path string, opts Options) (*backend, error) {
	if path == "" {
		return nil, errors.New("sqlitestore: a file path is required")
	}
	busy := opts.BusyTimeout
	if busy <= 0 {
		busy = 5 * time.Second
	}
	db, err := sql.Open("sqlite", dsn(path, busy))
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(4)
	db.SetMaxIdleConns(4)
	if err := migrateRetrying(ctx, db, busy); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlitestore: %s: %w", path, err)
	}
	return &backend{db: db}, nil
}

// migrateRetrying retries a migration that found the file locked: turning
// a new file to WAL needs an exclusive lock that SQLite does not wait for.
func migrateRetrying(ctx context.Context, db *sql.DB, busy time.Duration) error {
	end := time.Now().Add(busy)
	for {
		err := migrate(ctx, db)
		if err == nil || !isBusy(err) || time.Now().After(end) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func isBusy(err error) bool {
	var se *sqlite.Error
	if errors.As(err, &se) {
		c := se.Code() & 0xff
		return c == sqlite3.SQLITE_BUSY || c == sqlite3.SQLITE_LOCKED
	}
	return false
}

func migrate(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil) // BEGIN IMMEDIATE: one migrator at a time
	if err != nil {
		return fmt.Errorf("begin migration: %w", err)
	}
	defer tx.Rollback()
	var v int
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if v > SchemaVersion {
		return fmt.Errorf("schema version %d is newer than this build's %d; refusing to use it", v, SchemaVersion)
	}
	for i := v; i < SchemaVersion; i++ {
		if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
			return fmt.Errorf("migration %d: %w", i+1, err)
		}
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", SchemaVersion)); err != nil {
		return err
	}
	return tx.Commit()
}

func (b *backend) Load(ctx context.Context, id string) (rowstore.Row, int64, bool, error) {
	return rowstore.Scan(b.db.QueryRowContext(ctx, "SELECT "+rowstore.Columns+" FROM myriarch_leases WHERE id = ?", id).Scan, sql.ErrNoRows, "sqlitestore", id)
}

func (b *backend) Insert(ctx context.Context, id string, r rowstore.Row) (bool, error) {
	res, err := b.db.ExecContext(ctx, "INSERT INTO myriarch_leases ("+rowstore.Columns+", id) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
		r.Values(id)...)
	if err != nil {
		return false, fmt.Errorf("sqlitestore: insert %q: %w", id, err)
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

func (b *backend) CAS(ctx context.Context, id string, rev int64, r rowstore.Row) (bool, error) {
	res, err := b.db.ExecContext(ctx, `UPDATE myriarch_leases SET owner = ?, version = ?, renewed_at_ns = ?, expiry_ns = ?,
		endpoint = ?, obs_seq = ?, obs_elapsed_ns = ? WHERE id = ? AND obs_seq = ?`, r.Values(id, rev)...)
	if err != nil {
		return false, fmt.Errorf("sqlitestore: update %q: %w", id, err)
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

func (b *backend) Close() error { return b.db.Close() }

// wakeInterval is how often a standby process checks the file for a
// release: PRAGMA data_version on one connection, a read of the local
// file's shared memory; the rows are read only after a commit of another
// connection.
const wakeInterval = 20 * time.Millisecond

// Watch implements rowstore.Watcher for processes on one host: it reports
// the leases whose row became released since the last check.
func (b *backend) Watch(ctx context.Context, released func(id string)) {
	seen := map[string]int64{} // released rows already reported: id → version
	first := true
	var last int64 = -1
	t := time.NewTicker(wakeInterval)
	defer t.Stop()
	for {
		if conn, err := b.db.Conn(ctx); err == nil {
			b.watchConn(ctx, conn, t.C, seen, &first, &last, released)
			_ = conn.Close()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// watchConn checks on one connection (data_version is per connection)
// until ctx ends or a query fails.
func (b *backend) watchConn(ctx context.Context, conn *sql.Conn, tick <-chan time.Time, seen map[string]int64, first *bool, last *int64, released func(id string)) {
	for {
		var v int64
		if err := conn.QueryRowContext(ctx, "PRAGMA data_version").Scan(&v); err != nil {
			return
		}
		if v != *last {
			*last = v
			rows, err := conn.QueryContext(ctx, "SELECT id, version FROM myriarch_leases WHERE owner = ''")
			if err != nil {
				return
			}
			now := map[string]int64{}
			for rows.Next() {
				var id string
				var ver int64
				if rows.Scan(&id, &ver) == nil {
					now[id] = ver
				}
			}
			rows.Close()
			for id, ver := range now {
				if seen[id] != ver && !*first {
					released(id)
				}
			}
			clear(seen)
			maps.Copy(seen, now)
			*first = false
		}
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
	}
}
