// Package pgtest starts a throwaway PostgreSQL cluster from the local
// installation (initdb and pg_ctl) for tests and labs. (The private
// database of `myriarchd --dev` is internal/devdb, which this package
// shares the binaries and the run-as-postgres rule with.)
//
// As root, initdb and pg_ctl run as the postgres system user (initdb
// refuses root) in a directory that user owns. The server listens on
// 127.0.0.1 (or Options.ListenAddress) on a free port and on a unix socket
// in the cluster directory, with fsync off and trust authentication.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/myriarch/myriarch/internal/devdb"
)

// ErrNotInstalled reports that no PostgreSQL server binaries were found.
var ErrNotInstalled = devdb.ErrNotInstalled

// Options tune a cluster. The zero value is a loopback cluster.
type Options struct {
	// ListenAddress is the TCP address to listen on; default 127.0.0.1.
	ListenAddress string
	// Port to listen on; 0 picks a free port on ListenAddress.
	Port int
	// Dir is the cluster directory; default a new temporary directory that
	// Close removes.
	Dir string
	// Wrap prefixes the server start command, e.g. {"ip", "netns", "exec", "ns"}.
	Wrap []string
	// Settings are extra -c name=value server settings.
	Settings map[string]string
	// Log receives progress lines; nil discards them.
	Log func(format string, args ...any)
}

// Cluster is a running throwaway PostgreSQL.
type Cluster struct {
	opts    Options
	bin     string
	dir     string
	ownDir  bool
	Host    string // TCP listen address
	Port    int
	mu      sync.Mutex
	running bool
}

// BinDir finds the PostgreSQL server binaries (see devdb.BinDir).
func BinDir() (string, error) { return devdb.BinDir() }

// Start initializes and starts a cluster.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	if opts.ListenAddress == "" {
		opts.ListenAddress = "127.0.0.1"
	}
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	c := &Cluster{opts: opts, bin: bin, Host: opts.ListenAddress, Port: opts.Port, dir: opts.Dir}
	if c.dir == "" {
		c.dir, err = os.MkdirTemp("", "myriarch-pg-")
		if err != nil {
			return nil, err
		}
		c.ownDir = true
	}
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return nil, err
	}
	if err := devdb.ChownToServerUser(c.dir); err != nil {
		c.cleanup()
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(c.dataDir(), "PG_VERSION")); err != nil {
		out, err := c.run(ctx, nil, filepath.Join(bin, "initdb"), "-D", c.dataDir(), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
		if err != nil {
			c.cleanup()
			return nil, fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
		}
	}
	if c.Port != 0 {
		if err := c.StartServer(ctx); err != nil {
			c.cleanup()
			return nil, err
		}
		return c, nil
	}
	if len(opts.Wrap) > 0 {
		c.cleanup()
		return nil, errors.New("pgtest: Options.Port is required with Options.Wrap")
	}
	// A port that was free when picked can be taken before the server
	// binds it (parallel test packages pick ports too): pick another.
	for attempt := 1; ; attempt++ {
		if c.Port, err = pickPort(opts.ListenAddress); err != nil {
			c.cleanup()
			return nil, err
		}
		err = c.StartServer(ctx)
		if err == nil {
			return c, nil
		}
		if attempt == 5 || !strings.Contains(err.Error(), "Address already in use") {
			c.cleanup()
			return nil, err
		}
		opts.Log("pgtest: port %d was taken before the server bound it; trying another", c.Port)
	}
}

// TB is the part of testing.TB that New uses. The package does not import
// testing, so that `myriarch-lab leader` (internal/leaderlab), which
// starts clusters with Start, does not link the test framework into the
// production binary.
type TB interface {
	Helper()
	Logf(format string, args ...any)
	Skip(args ...any)
	Fatal(args ...any)
	Errorf(format string, args ...any)
	Cleanup(func())
}

// New starts a cluster for a test and stops it at the end. When PostgreSQL
// is not installed the test is skipped, except under CI=true where it fails.
func New(t TB) *Cluster {
	t.Helper()
	return NewWith(t, Options{})
}

// NewWith is New with options.
func NewWith(t TB, opts Options) *Cluster {
	t.Helper()
	if opts.Log == nil {
		opts.Log = t.Logf
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, opts)
	if errors.Is(err, ErrNotInstalled) && os.Getenv("CI") != "true" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("pgtest: close: %v", err)
		}
	})
	return c
}

// DSN returns a URL for database db (default "postgres") over TCP.
func (c *Cluster) DSN(db string) string {
	if db == "" {
		db = "postgres"
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", net.JoinHostPort(c.Host, strconv.Itoa(c.Port)), db)
}

// SocketDSN returns a URL for database db over the unix socket, which stays
// reachable from the root network namespace.
func (c *Cluster) SocketDSN(db string) string {
	if db == "" {
		db = "postgres"
	}
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable", db, c.dir, c.Port)
}

// Dir is the cluster directory (also the unix socket directory).
func (c *Cluster) Dir() string { return c.dir }

// Psql runs one SQL statement through psql over the unix socket and returns its output.
func (c *Cluster) Psql(ctx context.Context, sql string) (string, error) {
	psql := filepath.Join(c.bin, "psql")
	if _, err := os.Stat(psql); err != nil {
		psql = "psql"
	}
	out, err := exec.CommandContext(ctx, psql, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", c.dir, "-p", strconv.Itoa(c.Port), "-U", "postgres", "-d", "postgres", "-c", sql).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// StartServer starts the server of an initialized cluster (again).
func (c *Cluster) StartServer(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		return nil
	}
	opts := []string{
		"-c", "listen_addresses=" + c.Host,
		"-c", "port=" + strconv.Itoa(c.Port),
		"-c", "unix_socket_directories=" + c.dir,
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=300",
	}
	keys := make([]string, 0, len(c.opts.Settings))
	for k := range c.opts.Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		opts = append(opts, "-c", k+"="+c.opts.Settings[k])
	}
	args := []string{"-D", c.dataDir(), "-l", filepath.Join(c.dir, "server.log"), "-w", "-t", "60", "-o", strings.Join(opts, " "), "start"}
	out, err := c.run(ctx, c.opts.Wrap, filepath.Join(c.bin, "pg_ctl"), args...)
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
		return fmt.Errorf("pgtest: pg_ctl start: %w\n%s\n%s", err, out, log)
	}
	c.running = true
	c.opts.Log("pgtest: PostgreSQL on %s:%d (dir %s)", c.Host, c.Port, c.dir)
	return nil
}

// StopServer stops the server, keeping its data. mode is pg_ctl's
// shutdown mode: "fast" or "immediate".
func (c *Cluster) StopServer(ctx context.Context, mode string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running {
		return nil
	}
	if mode == "" {
		mode = "fast"
	}
	out, err := c.run(ctx, nil, filepath.Join(c.bin, "pg_ctl"), "-D", c.dataDir(), "-m", mode, "-w", "-t", "60", "stop")
	if err != nil {
		return fmt.Errorf("pgtest: pg_ctl stop: %w\n%s", err, out)
	}
	c.running = false
	return nil
}

// Close stops the server and removes a directory that Start created.
func (c *Cluster) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := c.StopServer(ctx, "immediate")
	c.cleanup()
	return err
}

func (c *Cluster) cleanup() {
	if c.ownDir {
		os.RemoveAll(c.dir)
	}
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }

// run runs a PostgreSQL binary, as the postgres user when we are root.
func (c *Cluster) run(ctx context.Context, wrap []string, name string, args ...string) ([]byte, error) {
	return devdb.Command(ctx, c.dir, wrap, name, args...).CombinedOutput()
}

// pickPort is FreePort; a test replaces it to hand out a taken port.
var pickPort = FreePort

// FreePort returns a TCP port that is free on host right now.
func FreePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
