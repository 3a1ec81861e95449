package store

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/myriarch/myriarch/internal/fleet/eventbus"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// TestDesiredConfigWriter: the one writer of desired configs serves both
// callers alike. A revision (SetDesiredRevision, rollouts) records the
// configuration and revision; a config set directly (SetDesiredConfig)
// keeps them; each announces every agent at the commit and a refused write
// announces none.
func TestDesiredConfigWriter(t *testing.T) {
	pg := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := open(t, pg.DSN(""))
	t0 := time.Now()
	for _, uid := range []string{"a1", "a2"} {
		if _, err := s.Connected(ctx, uid, "r1", "p1#1", t0); err != nil {
			t.Fatal(err)
		}
	}
	l, err := pgx.Connect(ctx, pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	if _, err := l.Exec(ctx, "LISTEN "+eventbus.Channel); err != nil {
		t.Fatal(err)
	}
	next := func() string {
		t.Helper()
		n, err := l.WaitForNotification(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n.Payload
	}

	if _, err := PutConfig(ctx, s.Pool, ConfigDef{Name: "c", Type: "yaml"}); err != nil {
		t.Fatal(err)
	}
	rev, _, err := AddRevision(ctx, s.Pool, "c", "x: 1\n", "t", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := SetDesiredRevision(ctx, s.Pool, []string{"a1", "a2"}, "c", rev); err != nil {
		t.Fatal(err)
	}
	if got := []string{next(), next()}; !slices.Equal(got, []string{"a1", "a2"}) {
		t.Fatalf("notified %v, want a1, a2", got)
	}
	a, err := AgentAssignment(ctx, s.Pool, "a2")
	if err != nil || a.DesiredConfig != "c" || a.DesiredRevision != rev.Revision || a.DesiredHash != rev.Hash {
		t.Fatalf("a2 after the revision: %+v, %v", a, err)
	}

	hash, err := s.SetDesiredConfig(ctx, "a1", "direct: true\n")
	if err != nil || hash != ConfigHash("direct: true\n") {
		t.Fatalf("SetDesiredConfig: %q, %v", hash, err)
	}
	if got := next(); got != "a1" {
		t.Fatalf("notified %q, want a1", got)
	}
	a, err = AgentAssignment(ctx, s.Pool, "a1")
	if err != nil || a.DesiredConfig != "c" || a.DesiredRevision != rev.Revision || a.DesiredHash != hash {
		t.Fatalf("a1 after a direct config: %+v, %v (want the name and revision kept, the new hash)", a, err)
	}
	d, err := s.DesiredConfigs(ctx, []string{"a1"})
	if err != nil || d["a1"].Body != "direct: true\n" {
		t.Fatalf("desired config of a1: %+v, %v", d, err)
	}

	if _, err := s.SetDesiredConfig(ctx, "nobody", "x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown agent: %v, want ErrNotFound", err)
	}
	if err := eventbus.Notify(ctx, s.Pool, eventbus.Restart, "marker"); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != "restart:marker" {
		t.Fatalf("notified %q after a refused write, want only the marker", got)
	}
}
