package pgtest

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

func TestClusterStartsStopsRestarts(t *testing.T) {
	c := New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := c.Psql(ctx, "SELECT 40 + 2")
	if err != nil || out != "42" {
		t.Fatalf("psql: %q %v", out, err)
	}
	if err := c.StopServer(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Psql(ctx, "SELECT 1"); err == nil {
		t.Fatal("query succeeded with the server stopped")
	}
	if err := c.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	out, err = c.Psql(ctx, "SHOW fsync")
	if err != nil || !strings.Contains(out, "off") {
		t.Fatalf("fsync: %q %v", out, err)
	}
}

// A port taken between picking it and the server binding it (another test
// package started something there) costs a retry on another port, not the
// test.
func TestStartRetriesWhenThePickedPortIsTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	var picks int
	pickPort = func(host string) (int, error) {
		picks++
		if picks == 1 {
			return takenPort, nil
		}
		return FreePort(host)
	}
	defer func() { pickPort = FreePort }()
	c := NewWith(t, Options{})
	if picks != 2 || c.Port == takenPort {
		t.Fatalf("picks %d, port %d (taken %d)", picks, c.Port, takenPort)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := c.Psql(ctx, "SELECT 1"); err != nil || out != "1" {
		t.Fatalf("psql: %q %v", out, err)
	}
}
