package embroker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// ErrNoMosquitto reports that no mosquitto binary was found.
var ErrNoMosquitto = errors.New("mosquitto not found (apt-get install -y mosquitto)")

// Mosquitto is a mosquitto process on a loopback port, for the tests that
// check a feature against a second, independent broker.
type Mosquitto struct {
	// Addr is 127.0.0.1:port.
	Addr   string
	cmd    *exec.Cmd
	exited chan struct{}
}

// MosquittoPath finds the mosquitto binary on $PATH or in /usr/sbin.
func MosquittoPath() (string, error) {
	if p, err := exec.LookPath("mosquitto"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/mosquitto"); err == nil {
		return "/usr/sbin/mosquitto", nil
	}
	return "", ErrNoMosquitto
}

// ComparisonSettings are DESIGN's settings for comparing against
// mosquitto: in-flight and queue limits raised, TCP_NODELAY.
const ComparisonSettings = "per_listener_settings true\npersistence false\nlog_dest stderr\nmax_inflight_messages 1000\nmax_queued_messages 100000\nset_tcp_nodelay true\n"

// StartMosquitto starts mosquitto with its config and log in dir: one
// loopback listener followed by listenerConf (TLS files, say; empty allows
// anonymous clients), with ComparisonSettings. Close stops it.
func StartMosquitto(ctx context.Context, dir, listenerConf string) (*Mosquitto, error) {
	return StartMosquittoWith(ctx, dir, ComparisonSettings, listenerConf)
}

// StartMosquittoWith is StartMosquitto with the global settings of the
// config file given (mosquitto's defaults where they say nothing).
func StartMosquittoWith(ctx context.Context, dir, settings, listenerConf string) (*Mosquitto, error) {
	bin, err := MosquittoPath()
	if err != nil {
		return nil, err
	}
	// mosquitto cannot listen on a port of the kernel's choice and report
	// it, so the port is found free here and bound by mosquitto a moment
	// later; another process can take it in between. Then try another.
	for attempt := 1; ; attempt++ {
		m, err := startMosquitto(ctx, bin, dir, settings, listenerConf)
		if errors.Is(err, errAddrInUse) && attempt < 5 {
			continue
		}
		return m, err
	}
}

var errAddrInUse = errors.New("address already in use")

// pickPort is FreePort; a test makes it return a port in use.
var pickPort = FreePort

func startMosquitto(ctx context.Context, bin, dir, settings, listenerConf string) (*Mosquitto, error) {
	addr, err := pickPort()
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	if listenerConf == "" {
		listenerConf = "allow_anonymous true\n"
	}
	conf := fmt.Sprintf("%slistener %s 127.0.0.1\n%s", settings, port, listenerConf)
	if os.Geteuid() == 0 {
		// As root mosquitto drops to the mosquitto user, which may not
		// read dir; it needs no privilege on a loopback port.
		conf += "\nuser root\n"
	}
	path := filepath.Join(dir, "mosquitto.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "mosquitto.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-c", path)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	m := &Mosquitto{Addr: addr, cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(m.exited)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return m, nil
		}
		select {
		case <-m.exited:
			log, _ := os.ReadFile(filepath.Join(dir, "mosquitto.log"))
			if strings.Contains(string(log), "Address already in use") {
				return nil, fmt.Errorf("mosquitto on %s: %w: %s", addr, errAddrInUse, log)
			}
			return nil, fmt.Errorf("mosquitto exited at start: %s", log)
		case <-ctx.Done():
			m.Close()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			m.Close()
			return nil, fmt.Errorf("mosquitto not listening on %s after 20s", addr)
		}
	}
}

// TestMosquitto starts mosquitto for t (see StartMosquitto) and stops it
// when t ends. Without mosquitto the test skips, or fails under CI=true,
// where .ci/run installs it.
func TestMosquitto(t TB, listenerConf string) *Mosquitto {
	t.Helper()
	m, err := StartMosquitto(context.Background(), t.TempDir(), listenerConf)
	if errors.Is(err, ErrNoMosquitto) && os.Getenv("CI") != "true" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// TB is the part of testing.TB that TestMosquitto uses (this package is
// also linked into the lab command, which should not import testing).
type TB interface {
	Helper()
	TempDir() string
	Cleanup(func())
	Skip(args ...any)
	Fatal(args ...any)
}

// Close stops mosquitto.
func (m *Mosquitto) Close() {
	select {
	case <-m.exited:
		return
	default:
	}
	_ = m.cmd.Process.Kill()
	<-m.exited
}
