package testnet

import (
	"errors"
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
