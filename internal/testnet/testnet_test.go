package testnet

import (
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

func TestDeadAddrRefusesAndCannotBeTaken(t *testing.T) {
	addr := DeadAddr(t)
	if _, err := net.DialTimeout("tcp", addr, 5*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s: %v, want connection refused", addr, err)
	}
	if l, err := net.Listen("tcp", addr); err == nil {
		l.Close()
		t.Fatalf("another listener could take %s", addr)
	}
}

// A relay forwards both ways to its target, refuses with none, and
// forwards to a new target after SetTarget.
func TestRelayForwardsRefusesAndRetargets(t *testing.T) {
	echo := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() { _, _ = io.Copy(c, c); _ = c.Close() }()
			}
		}()
		return l.Addr().String()
	}
	roundTrip := func(r *Relay) error {
		c, err := net.Dial("tcp", r.Addr())
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		if string(buf) != "ping" {
			return fmt.Errorf("got %q", buf)
		}
		return nil
	}
	r := NewRelay(t, echo())
	if err := roundTrip(r); err != nil {
		t.Fatalf("through the relay: %v", err)
	}
	r.SetTarget("")
	if err := roundTrip(r); err == nil {
		t.Fatal("a relay without a target forwarded")
	}
	r.SetTarget(echo())
	if err := roundTrip(r); err != nil {
		t.Fatalf("after SetTarget: %v", err)
	}
}
