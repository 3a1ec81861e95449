// Package amqptest starts a throwaway RabbitMQ node from Debian's
// rabbitmq-server for a test: its own node name, ports, data and log
// directories and Erlang cookie in a temporary directory, so that it
// neither needs nor touches the system's node. Tests only: production
// binaries must not link it (internal/archtest).
package amqptest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/pgtest"
)

// Dir is where Debian installs RabbitMQ's scripts. They run as the calling
// user; /usr/sbin's wrappers would switch to the rabbitmq user, which
// cannot write a test's temporary directory.
const Dir = "/usr/lib/rabbitmq/bin"

// StartLimit bounds a node's start (about 10s on an idle machine).
const StartLimit = 2 * time.Minute

// Node is one running (or stopped) RabbitMQ node.
type Node struct {
	t    testing.TB
	dir  string
	name string
	port int
	dist int
	cmd  *exec.Cmd
	exit chan error
}

// Start starts a node for t and stops it at the end of the test. Without
// rabbitmq-server the test is skipped, except under CI=true where it fails.
func Start(t testing.TB) *Node {
	t.Helper()
	if _, err := os.Stat(filepath.Join(Dir, "rabbitmq-server")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("amqptest: rabbitmq-server is not installed (%v); CI installs Debian's rabbitmq-server", err)
		}
		t.Skipf("amqptest: rabbitmq-server is not installed: %v", err)
	}
	dir := t.TempDir()
	n := &Node{t: t, dir: dir, name: fmt.Sprintf("rabbit-%d-%d@localhost", os.Getpid(), time.Now().UnixNano()%1e9),
		port: freePort(t), dist: freePort(t)}
	for _, d := range []string{"home", "mnesia", "log"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	conf := fmt.Sprintf("listeners.tcp.default = %d\nloopback_users = none\n", n.port)
	if err := os.WriteFile(filepath.Join(dir, "rabbit.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("[].\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Kill)
	n.Start()
	return n
}

// URL is the node's AMQP URL with the default guest account.
func (n *Node) URL() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.port) }

// Addr is the node's AMQP address.
func (n *Node) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port)) }

func (n *Node) env() []string {
	return append(os.Environ(),
		"HOME="+filepath.Join(n.dir, "home"),
		"RABBITMQ_NODENAME="+n.name,
		"RABBITMQ_NODE_PORT="+strconv.Itoa(n.port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(n.dist),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(n.dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(n.dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(n.dir, "rabbit"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(n.dir, "advanced.config"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(n.dir, "rabbitmq-env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(n.dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE="+filepath.Join(n.dir, "rabbit.pid"),
	)
}

// Start starts the (stopped) node on its port, with the data it had, and
// waits until it takes connections.
func (n *Node) Start() {
	n.t.Helper()
	out, err := os.OpenFile(filepath.Join(n.dir, "server.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.Command(filepath.Join(Dir, "rabbitmq-server"))
	cmd.Env = n.env()
	cmd.Dir = n.dir
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group: Kill ends the script, the Erlang VM and its
	// helpers at once (epmd daemonizes into its own session and stays, as
	// it does for every Erlang node on the host).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.cmd, n.exit = cmd, make(chan error, 1)
	go func() { n.exit <- cmd.Wait() }()
	deadline := time.Now().Add(StartLimit)
	for {
		if err := n.ctl("await_startup"); err == nil {
			if c, err := net.DialTimeout("tcp", n.Addr(), time.Second); err == nil {
				_ = c.Close()
				return
			}
		}
		select {
		case err := <-n.exit:
			n.exit <- err
			n.t.Fatalf("amqptest: rabbitmq-server exited during start: %v\n%s", err, n.tail())
		default:
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("amqptest: rabbitmq-server did not start within %v\n%s", StartLimit, n.tail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ctl runs rabbitmqctl against the node.
func (n *Node) ctl(args ...string) error {
	cmd := exec.Command(filepath.Join(Dir, "rabbitmqctl"), append([]string{"-n", n.name, "-q"}, args...)...)
	cmd.Env = n.env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("rabbitmqctl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Ctl runs rabbitmqctl against the node and fails the test on an error.
func (n *Node) Ctl(args ...string) {
	n.t.Helper()
	if err := n.ctl(args...); err != nil {
		n.t.Fatal(err)
	}
}

// Stop stops the node gracefully (rabbitmqctl stop) and waits for its
// process to end.
func (n *Node) Stop() {
	n.t.Helper()
	if n.cmd == nil {
		return
	}
	if err := n.ctl("stop"); err != nil {
		n.t.Logf("amqptest: %v; killing the node", err)
		n.Kill()
		return
	}
	select {
	case <-n.exit:
	case <-time.After(StartLimit):
		n.t.Logf("amqptest: node did not exit after stop; killing it")
		n.Kill()
		return
	}
	n.kill() // helpers left in the group
	n.cmd = nil
}

// Kill ends the node's process group at once (SIGKILL): a crash.
func (n *Node) Kill() {
	if n.cmd == nil {
		return
	}
	n.kill()
	select {
	case <-n.exit:
	case <-time.After(30 * time.Second):
		n.t.Errorf("amqptest: node process did not exit after SIGKILL")
	}
	n.cmd = nil
}

func (n *Node) kill() {
	if err := syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		n.t.Logf("amqptest: kill: %v", err)
	}
}

func (n *Node) tail() string {
	b, _ := os.ReadFile(filepath.Join(n.dir, "server.out"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func freePort(t testing.TB) int {
	t.Helper()
	p, err := pgtest.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return p
}
