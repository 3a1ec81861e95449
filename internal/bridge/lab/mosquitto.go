package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
)

// ErrNoMosquitto reports that no mosquitto binary was found.
var ErrNoMosquitto = errors.New("mosquitto not found (apt-get install -y mosquitto)")

// MosquittoDefaultMaxQueued is mosquitto 2.0's default max_queued_messages:
// beyond it, messages for an offline persistent session are dropped
// silently.
const MosquittoDefaultMaxQueued = 1000

// Mosquitto is a mosquitto broker on a loopback port.
type Mosquitto struct {
	// URL is tcp://127.0.0.1:port.
	URL    string
	cmd    *exec.Cmd
	exited chan struct{}
}

// MosquittoPath finds the mosquitto binary on $PATH or in /usr/sbin, where
// Debian installs it.
func MosquittoPath() (string, error) {
	if p, err := exec.LookPath("mosquitto"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/mosquitto"); err == nil {
		return "/usr/sbin/mosquitto", nil
	}
	return "", ErrNoMosquitto
}

// StartMosquitto starts mosquitto with its config and log in dir.
// maxQueued is written as max_queued_messages; negative keeps mosquitto's
// default (1000), so that the run shows what a default broker does.
// max_inflight_messages stays at its default too.
func StartMosquitto(ctx context.Context, dir string, maxQueued int) (*Mosquitto, error) {
	bin, err := MosquittoPath()
	if err != nil {
		return nil, err
	}
	addr, err := embroker.FreePort()
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	conf := fmt.Sprintf("listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest stderr\nlog_type error\nlog_type warning\nlog_type notice\nset_tcp_nodelay true\n", port)
	if maxQueued >= 0 {
		conf += fmt.Sprintf("max_queued_messages %d\n", maxQueued)
	}
	if os.Geteuid() == 0 {
		// As root mosquitto drops to the mosquitto user, which may lack
		// the directory; it needs no privilege on a loopback port.
		conf += "user root\n"
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
	m := &Mosquitto{URL: "tcp://" + addr, cmd: cmd, exited: make(chan struct{})}
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
			return nil, fmt.Errorf("mosquitto exited at start (log in %s)", dir)
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
