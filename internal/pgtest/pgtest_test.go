package pgtest

import (
	"context"
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
