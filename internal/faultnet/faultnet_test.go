package faultnet

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// echo is a line echo server; it returns its address.
func echo(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { l.Close(); <-done })
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			go func() { _, _ = io.Copy(c, c) }()
		}
	}()
	return l.Addr().String()
}

func dialLine(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// roundTrip writes a line and reads it back within d; it returns the error
// of the read (a timeout when nothing came back).
func roundTrip(c net.Conn, r *bufio.Reader, line string, d time.Duration) (string, error) {
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	s, err := r.ReadString('\n')
	return strings.TrimSuffix(s, "\n"), err
}

func start(t *testing.T, o Options, targets ...string) *Proxy {
	t.Helper()
	p, err := Listen(o, targets...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestForwardsAndEachFault(t *testing.T) {
	p := start(t, Options{}, echo(t))
	c, r := dialLine(t, p.Addr())
	if got, err := roundTrip(c, r, "hello", 5*time.Second); err != nil || got != "hello" {
		t.Fatalf("forward: %q %v", got, err)
	}

	// Blackhole: nothing comes back and nothing is closed.
	p.Blackhole(true)
	if _, err := roundTrip(c, r, "lost", 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("blackhole: read %v, want a timeout (not a close)", err)
	}
	p.Blackhole(false)

	// SwallowReplies: a second connection's requests arrive (the echo
	// answers) but the answers are thrown away.
	p.SwallowReplies(true)
	c2, r2 := dialLine(t, p.Addr())
	if _, err := roundTrip(c2, r2, "unanswered", 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("swallow replies: read %v, want a timeout", err)
	}
	p.SwallowReplies(false)
	if got, err := roundTrip(c2, r2, "answered", 5*time.Second); err != nil || !strings.HasSuffix(got, "answered") {
		t.Fatalf("after swallow: %q %v", got, err)
	}

	// Cut: the client sees its connection closed.
	p.Cut()
	if _, err := roundTrip(c2, r2, "cut", 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("cut: read %v, want a closed connection", err)
	}

	// Refuse: new connections close at once; Accepted counts them.
	before := p.Accepted()
	p.Refuse(true)
	c3, r3 := dialLine(t, p.Addr())
	if _, err := roundTrip(c3, r3, "refused", 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("refuse: read %v, want a closed connection", err)
	}
	if p.Accepted() != before+1 {
		t.Fatalf("accepted %d, want %d", p.Accepted(), before+1)
	}
	p.Refuse(false)

	// Freeze: nothing is read any more and nothing is closed.
	c4, r4 := dialLine(t, p.Addr())
	if got, err := roundTrip(c4, r4, "before", 5*time.Second); err != nil || got != "before" {
		t.Fatalf("before freeze: %q %v", got, err)
	}
	p.Freeze()
	if _, err := roundTrip(c4, r4, "frozen", 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("freeze: read %v, want a timeout", err)
	}
}

// Retargeting sends new connections to a server restarted elsewhere; no
// target closes them; an unreachable target is skipped for the next.
func TestTargets(t *testing.T) {
	p := start(t, Options{})
	c, r := dialLine(t, p.Addr())
	if _, err := roundTrip(c, r, "x", 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("no target: %v, want a close", err)
	}
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	p.SetTargets(deadAddr, echo(t))
	for i := range 4 {
		c, r := dialLine(t, p.Addr())
		if got, err := roundTrip(c, r, "y", 5*time.Second); err != nil || got != "y" {
			t.Fatalf("connection %d: %q %v", i, got, err)
		}
	}
}

// A handshake sees the client first and decides what the server gets.
func TestHandshake(t *testing.T) {
	p := start(t, Options{Handshake: func(c net.Conn) ([]byte, error) {
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return nil, err
		}
		if line == "no\n" {
			_, _ = c.Write([]byte("refused\n"))
			return nil, errors.New("refused")
		}
		return []byte("via:" + line), nil
	}}, echo(t))
	c, r := dialLine(t, p.Addr())
	if got, err := roundTrip(c, r, "hi", 5*time.Second); err != nil || got != "via:hi" {
		t.Fatalf("handshake: %q %v", got, err)
	}
	c2, r2 := dialLine(t, p.Addr())
	if got, _ := roundTrip(c2, r2, "no", 5*time.Second); got != "refused" {
		t.Fatalf("refusing handshake: %q", got)
	}
}
