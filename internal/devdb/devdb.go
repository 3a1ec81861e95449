// Package devdb runs the private development PostgreSQL of `myriarchd
// --dev` from the local installation (initdb and pg_ctl). It is production
// code (linked into myriarchd); the throwaway clusters of the tests are
// internal/pgtest, which shares BinDir and Command with it.
//
// The database lives in a directory that only its owner can enter (0700):
//
//	<dir>/pg/data       the cluster
//	<dir>/pg            the unix socket (no TCP listener)
//	<dir>/pgpass        the generated password of the postgres role (0600)
//
// Clients connect over the unix socket with scram-sha-256 password
// authentication; the DSN names the password file instead of the password.
// As root, initdb and the server run as the postgres system user (initdb
// refuses root) and the directory belongs to that user; the parent
// directories must be searchable by it.
//
// A server left running by an earlier process that was killed (kill -9
// does not stop the postmaster that pg_ctl started) is found by Start and
// reused: it is the same cluster in the same private directory.
package devdb

import (
	"context"
	crand "crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ErrNotInstalled reports that no PostgreSQL server binaries were found.
var ErrNotInstalled = errors.New("PostgreSQL server binaries (initdb, pg_ctl) not found; install the postgresql package or set PG_BIN")

// ServerUser is the system user the server runs as when the caller is root.
const ServerUser = "postgres"

// socketPort names the socket file (.s.PGSQL.<port>); nothing listens on
// TCP, and the directory is private, so a fixed number cannot clash.
const socketPort = 5432

// BinDir finds the PostgreSQL server binaries: $PG_BIN, the newest
// /usr/lib/postgresql/*/bin, or pg_ctl on PATH.
func BinDir() (string, error) {
	if d := os.Getenv("PG_BIN"); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", ErrNotInstalled
}

// Command returns the command that runs a PostgreSQL binary in dir: as the
// postgres system user when the caller is root, prefixed by wrap (for
// example {"ip", "netns", "exec", "ns"}).
func Command(ctx context.Context, dir string, wrap []string, name string, args ...string) *exec.Cmd {
	argv := append([]string{name}, args...)
	if os.Geteuid() == 0 {
		argv = append([]string{"runuser", "-u", ServerUser, "--"}, argv...)
	}
	argv = append(append([]string{}, wrap...), argv...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd
}

// ChownToServerUser gives dir to the postgres system user when the caller
// is root (the server must own its directories); otherwise it does
// nothing.
func ChownToServerUser(dir string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup(ServerUser)
	if err != nil {
		return fmt.Errorf("running PostgreSQL as root needs the %s system user: %w", ServerUser, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(dir, uid, gid)
}

// DefaultDir is the default directory of --dev: $XDG_STATE_HOME/myriarchd/dev
// (~/.local/state/myriarchd/dev) for a user, /var/lib/myriarchd/dev for
// root (whose home the postgres user cannot enter). Start creates it
// private (0700).
func DefaultDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/myriarchd/dev"
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "myriarchd", "dev")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "state", "myriarchd", "dev")
	}
	return filepath.Join(os.TempDir(), "myriarchd-dev-"+strconv.Itoa(os.Getuid()))
}

// DB is a running development database.
type DB struct {
	dir    string
	bin    string
	reused bool
	log    func(format string, args ...any)
}

// Start creates (on first use) and starts the database in dir, or reuses
// the server of dir that an earlier, killed process left running. log
// receives progress lines (nil discards them).
func Start(ctx context.Context, dir string, log func(format string, args ...any)) (*DB, error) {
	if log == nil {
		log = func(string, ...any) {}
	}
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	d := &DB{dir: dir, bin: bin, log: log}
	if err := d.prepareDir(); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(d.dataDir(), "PG_VERSION")); err != nil {
		if err := d.initdb(ctx); err != nil {
			return nil, err
		}
	} else if _, err := os.Stat(d.passFile()); err != nil {
		return nil, fmt.Errorf("%s holds a cluster without the password file %s (made by an older myriarchd --dev, with trust authentication over TCP); remove the directory to start afresh", dir, d.passFile())
	}
	if d.running(ctx) {
		// A kill -9 of the previous myriarchd left its server running; it
		// holds the lock file of the data directory, so a second start
		// would fail. It is this cluster: use it.
		d.reused = true
		log("devdb: reusing the PostgreSQL that is still running in %s (its myriarchd was killed)", d.pgDir())
		return d, nil
	}
	if err := d.start(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// prepareDir creates dir and its pg subdirectory private to their owner:
// the caller, or the postgres user when the caller is root. An existing
// directory that holds something else is refused, not taken over: its
// mode and owner would change.
func (d *DB) prepareDir() error {
	if entries, err := os.ReadDir(d.dir); err == nil && len(entries) > 0 {
		_, errPG := os.Stat(d.pgDir())
		_, errPass := os.Stat(d.passFile())
		if errPG != nil && errPass != nil {
			return fmt.Errorf("%s is not empty and holds no --dev database (no pg or pgpass in it); give a new or empty directory", d.dir)
		}
	}
	// The parents this creates (the default /var/lib/myriarchd/dev on a
	// fresh host) must be searchable by the postgres user that runs the
	// server as root's stand-in; existing ones keep their mode.
	if err := os.MkdirAll(filepath.Dir(d.dir), 0o755); err != nil {
		return err
	}
	for _, p := range []string{d.dir, d.pgDir()} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			return err
		}
		// MkdirAll keeps the mode of an existing directory, and the umask
		// applies to new ones: make it exactly 0700.
		if err := os.Chmod(p, 0o700); err != nil {
			return err
		}
		if err := ChownToServerUser(p); err != nil {
			return err
		}
	}
	return nil
}

func (d *DB) initdb(ctx context.Context) error {
	var r [24]byte
	_, _ = crand.Read(r[:])
	password := base64.RawURLEncoding.EncodeToString(r[:])
	// initdb reads the password from a file that the server user can read;
	// it is removed right after.
	pw := filepath.Join(d.pgDir(), "initdb-password")
	if err := os.WriteFile(pw, []byte(password+"\n"), 0o600); err != nil {
		return err
	}
	defer os.Remove(pw)
	if err := ChownToServerUser(pw); err != nil {
		return err
	}
	out, err := Command(ctx, d.pgDir(), nil, filepath.Join(d.bin, "initdb"), "-D", d.dataDir(), "-U", "postgres",
		"--auth-local=scram-sha-256", "--auth-host=reject", "--pwfile="+pw, "-E", "UTF8", "--no-sync").CombinedOutput()
	if err != nil {
		return d.explain(fmt.Errorf("initdb: %w\n%s", err, out), string(out))
	}
	// pgx reads the password from here (passfile in the DSN): the password
	// never appears on a command line or in the printed DSN.
	return os.WriteFile(d.passFile(), []byte("*:*:*:postgres:"+password+"\n"), 0o600)
}

func (d *DB) start(ctx context.Context) error {
	opts := strings.Join([]string{
		"-c listen_addresses=''",
		"-c port=" + strconv.Itoa(socketPort),
		"-c unix_socket_directories=" + d.pgDir(),
		"-c unix_socket_permissions=0700",
	}, " ")
	logFile := filepath.Join(d.pgDir(), "server.log")
	out, err := Command(ctx, d.pgDir(), nil, filepath.Join(d.bin, "pg_ctl"), "-D", d.dataDir(), "-l", logFile, "-w", "-t", "60", "-o", opts, "start").CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(logFile)
		return d.explain(fmt.Errorf("pg_ctl start: %w\n%s\n%s", err, out, tail(string(log), 20)), string(out)+string(log))
	}
	d.log("devdb: PostgreSQL on the unix socket in %s", d.pgDir())
	return nil
}

// running reports whether the server of the data directory runs.
func (d *DB) running(ctx context.Context) bool {
	if _, err := os.Stat(filepath.Join(d.dataDir(), "postmaster.pid")); err != nil {
		return false
	}
	return Command(ctx, d.pgDir(), nil, filepath.Join(d.bin, "pg_ctl"), "-D", d.dataDir(), "status").Run() == nil
}

// explain adds the cause an operator can act on to a failure of initdb or
// pg_ctl, and only when the output shows it: a permission problem names
// the directories, a port or lock conflict says so.
func (d *DB) explain(err error, output string) error {
	switch {
	case strings.Contains(output, "Permission denied") && os.Geteuid() == 0:
		return fmt.Errorf("%w\n(as root, PostgreSQL runs as the %s user: every parent directory of %s must be searchable by it)", err, ServerUser, d.dir)
	case strings.Contains(output, "Permission denied"):
		return fmt.Errorf("%w\n(check the permissions of %s)", err, d.dir)
	case strings.Contains(output, "lock file") && strings.Contains(output, "already exists"):
		return fmt.Errorf("%w\n(another PostgreSQL holds the lock file of %s and pg_ctl does not report it as running; stop it, or remove postmaster.pid if no such process exists)", err, d.dataDir())
	}
	return err
}

// Reused reports whether Start found the server already running.
func (d *DB) Reused() bool { return d.reused }

// DSN is the URL of database db (default "postgres") over the unix socket,
// with the password file.
func (d *DB) DSN(db string) string {
	if db == "" {
		db = "postgres"
	}
	q := url.Values{}
	q.Set("host", d.pgDir())
	q.Set("port", strconv.Itoa(socketPort))
	q.Set("passfile", d.passFile())
	q.Set("sslmode", "disable")
	return "postgres://postgres@/" + db + "?" + q.Encode()
}

// Dir is the database's directory.
func (d *DB) Dir() string { return d.dir }

// Stop stops the server (fast shutdown), keeping its data.
func (d *DB) Stop(ctx context.Context) error {
	out, err := Command(ctx, d.pgDir(), nil, filepath.Join(d.bin, "pg_ctl"), "-D", d.dataDir(), "-m", "fast", "-w", "-t", "60", "stop").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl stop: %w\n%s", err, out)
	}
	return nil
}

// StopTimeout bounds Stop in callers that have no deadline of their own.
const StopTimeout = time.Minute

func (d *DB) pgDir() string    { return filepath.Join(d.dir, "pg") }
func (d *DB) dataDir() string  { return filepath.Join(d.pgDir(), "data") }
func (d *DB) passFile() string { return filepath.Join(d.dir, "pgpass") }

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
