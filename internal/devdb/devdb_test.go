package devdb

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func needPostgres(t *testing.T) {
	t.Helper()
	if _, err := BinDir(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// newDir returns a directory under a parent that the postgres user can
// search (t.TempDir's parent is private; as root the server runs as
// postgres).
func newDir(t *testing.T) string {
	t.Helper()
	parent, err := os.MkdirTemp("", "devdb-test-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	return filepath.Join(parent, "dev")
}

func query(ctx context.Context, dsn, sql string) (string, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var out string
	err = conn.QueryRow(ctx, sql).Scan(&out)
	return out, err
}

// The development database is private: a 0700 directory, a unix socket in
// it, no TCP listener, and a password that a client without the password
// file does not have.
func TestPrivateDirectorySocketAndPassword(t *testing.T) {
	needPostgres(t)
	dir := newDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := Start(ctx, dir, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop(context.Background())
	for _, p := range []string{dir, filepath.Join(dir, "pg")} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("%s: mode %v, %v; want 0700", p, fi.Mode().Perm(), err)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "pgpass")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("pgpass: %v, %v", fi, err)
	}
	if strings.Contains(d.DSN(""), "127.0.0.1") || !strings.Contains(d.DSN(""), "passfile=") {
		t.Fatalf("DSN %s: want the unix socket and the password file", d.DSN(""))
	}
	got, err := query(ctx, d.DSN(""), "SELECT current_setting('listen_addresses') || '|' || (SELECT string_agg(DISTINCT auth_method, ',') FROM pg_hba_file_rules WHERE type = 'local')")
	if err != nil || got != "|scram-sha-256" {
		t.Fatalf("listen_addresses|local auth = %q, %v; want no TCP and scram-sha-256", got, err)
	}
	noPass := strings.Replace(d.DSN(""), "passfile=", "x_passfile=", 1)
	noPass = strings.Replace(noPass, "x_passfile=", "application_name=", 1)
	t.Setenv("PGPASSFILE", filepath.Join(dir, "absent"))
	_, err = query(ctx, noPass, "SELECT 'in'")
	var pgErr *pgconn.PgError
	if err == nil || (errors.As(err, &pgErr) && pgErr.Code != "28P01") {
		t.Fatalf("connected without the password: %v", err)
	}
}

// myriarchd --dev killed with kill -9 leaves its PostgreSQL running (pg_ctl
// started it as a daemon), holding the lock file of the data directory.
// The next start reuses that server instead of failing, and stops it at
// the end as usual.
func TestStartAfterKill9ReusesTheRunningServer(t *testing.T) {
	needPostgres(t)
	dir := newDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first, err := Start(ctx, dir, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	pid1, err := query(ctx, first.DSN(""), "SELECT pg_postmaster_start_time()::text")
	if err != nil {
		t.Fatal(err)
	}
	// The first process dies without stopping its server.
	second, err := Start(ctx, dir, t.Logf)
	if err != nil {
		first.Stop(context.Background())
		t.Fatalf("start after a kill -9: %v", err)
	}
	if !second.Reused() {
		t.Error("the second start did not report the reuse")
	}
	pid2, err := query(ctx, second.DSN(""), "SELECT pg_postmaster_start_time()::text")
	if err != nil || pid2 != pid1 {
		t.Errorf("second start: postmaster started %q (%v), first %q", pid2, err, pid1)
	}
	if err := second.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "pg", "data", "postmaster.pid")); !os.IsNotExist(err) {
		t.Fatalf("server still running after Stop: %v", err)
	}
	// And a start after a clean stop starts it again.
	third, err := Start(ctx, dir, t.Logf)
	if err != nil || third.Reused() {
		t.Fatalf("start after stop: reused %v, %v", third != nil && third.Reused(), err)
	}
	if err := third.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// The production binary must not link the test framework (the reason this
// package exists apart from internal/pgtest).
func TestMyriarchdDoesNotLinkTesting(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command("go", "list", "-deps", "github.com/myriarch/myriarch/cmd/myriarchd").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "testing" {
			t.Fatal("cmd/myriarchd links package testing")
		}
	}
}

// A directory that holds something else is refused and left as it was.
func TestRefusesAForeignDirectory(t *testing.T) {
	needPostgres(t)
	dir := newDir(t)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Start(context.Background(), dir, t.Logf)
	if err == nil || !strings.Contains(err.Error(), "holds no --dev database") {
		t.Fatalf("Start on a foreign directory: %v", err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("foreign directory changed: %v, %v", fi.Mode(), err)
	}
}
