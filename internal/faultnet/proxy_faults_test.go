package faultnet

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// TestProxyRefuseCounts: a refusing proxy closes connections at once and
// counts them, which is how the lab sees a resumed owner reconnect.
func TestProxyRefuseCounts(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("x"))
			_ = c.Close()
		}
	}()
	p, err := Listen(Options{}, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	read := func() string {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 1)
		n, _ := c.Read(b)
		return string(b[:n])
	}
	if got := read(); got != "x" {
		t.Fatalf("forwarded %q, want x", got)
	}
	p.Refuse(true)
	if got := read(); got != "" {
		t.Fatalf("refusing proxy forwarded %q", got)
	}
	if n := p.Accepted(); n != 2 {
		t.Fatalf("accepted %d, want 2", n)
	}
}

// With SwallowReplies the target still receives what the client sends but
// the client hears nothing back; Cut drops the open connection (the client
// reads EOF) and the next connection is forwarded again.
func TestProxySwallowRepliesAndCut(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	received := make(chan byte, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := make([]byte, 1)
				for {
					if _, err := c.Read(b); err != nil {
						return
					}
					received <- b[0]
					_, _ = c.Write(b) // echo
				}
			}()
		}
	}()
	p, err := Listen(Options{}, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo := func(b byte, wait time.Duration) (byte, error) {
		if _, err := c.Write([]byte{b}); err != nil {
			return 0, err
		}
		_ = c.SetReadDeadline(time.Now().Add(wait))
		got := make([]byte, 1)
		_, err := c.Read(got)
		return got[0], err
	}
	if got, err := echo('a', 5*time.Second); err != nil || got != 'a' {
		t.Fatalf("echo: %q %v", got, err)
	}
	<-received
	p.SwallowReplies(true)
	if got, err := echo('b', 300*time.Millisecond); err == nil {
		t.Fatalf("a swallowed reply arrived: %q", got)
	}
	select {
	case b := <-received:
		if b != 'b' {
			t.Fatalf("target received %q", b)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the client's byte did not reach the target while replies were swallowed")
	}
	p.SwallowReplies(false)
	p.Cut()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection survived Cut")
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c = c2
	if got, err := echo('c', 5*time.Second); err != nil || got != 'c' {
		t.Fatalf("after Cut: %q %v", got, err)
	}
}

// DelayReplies: an answer arrives, but not before the delay; a read that
// gives up sooner times out, and ending the delay restores the path.
func TestProxyDelayReplies(t *testing.T) {
	p := start(t, Options{}, echo(t))
	c, r := dialLine(t, p.Addr())
	p.DelayReplies(300 * time.Millisecond)
	if _, err := roundTrip(c, r, "late", 100*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("delayed: read %v, want a timeout before the delay passed", err)
	}
	// The held answer still comes, after the delay.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "late\n" {
		t.Fatalf("delayed answer: %q %v", got, err)
	}
	_ = c.SetReadDeadline(time.Time{})
	start := time.Now()
	if got, err := roundTrip(c, r, "slow", 5*time.Second); err != nil || got != "slow" {
		t.Fatalf("delayed round trip: %q %v", got, err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("round trip took %v under a 300ms reply delay", took)
	}
	p.DelayReplies(0)
	if got, err := roundTrip(c, r, "prompt", 5*time.Second); err != nil || got != "prompt" {
		t.Fatalf("after the delay: %q %v", got, err)
	}
}
