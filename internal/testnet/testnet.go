// Package testnet has network helpers for tests.
package testnet

import (
	"fmt"
	"syscall"
	"testing"
)

// DeadAddr returns a loopback address where nothing accepts connections
// for the rest of the test: a socket bound to it but never listening, so
// a connection is refused and no other test can start listening there.
// A port that was free once and then released is no such address: another
// package's test may bind it in the meantime.
func DeadAddr(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}
