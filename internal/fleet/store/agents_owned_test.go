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
// configuration, the revision and the rollout that sent it; a
// config pushed directly (SetDesiredConfigBy) records its author and
// forgets the revision it replaced; a clear records no source; each
// announces every agent at the commit and a refused write announces none.
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
	// Rollout 7 sends the revision to both; then a2 gets it by assignment.
	rid := int64(7)
	if err := SetDesiredRevisionBy(ctx, s.Pool, []string{"a1", "a2"}, "c", rev, rid, "token rel"); err != nil {
		t.Fatal(err)
	}
	if got := []string{next(), next()}; !slices.Equal(got, []string{"a1", "a2"}) {
		t.Fatalf("notified %v, want a1, a2", got)
	}
	if err := SetDesiredRevision(ctx, s.Pool, []string{"a2"}, "c", rev); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != "a2" {
		t.Fatalf("notified %q, want a2", got)
	}
	for uid, want := range map[string]DesiredSource{"a1": {Kind: DesiredFromRevision, Config: "c", Revision: 1, RolloutID: &rid, By: "token rel"},
		"a2": {Kind: DesiredFromRevision, Config: "c", Revision: 1}} {
		ag, err := s.GetAgent(ctx, uid)
		if err != nil {
			t.Fatal(err)
		}
		got := ag.DesiredSource
		if got == nil || got.Kind != want.Kind || got.Config != want.Config || got.Revision != want.Revision || got.By != want.By ||
			(got.RolloutID == nil) != (want.RolloutID == nil) || (got.RolloutID != nil && *got.RolloutID != rid) || time.Since(got.At) > time.Minute {
			t.Errorf("%s: source %+v, want %+v", uid, got, want)
		}
	}
	a, err := AgentAssignment(ctx, s.Pool, "a2")
	if err != nil || a.DesiredConfig != "c" || a.DesiredRevision != rev.Revision || a.DesiredHash != rev.Hash {
		t.Fatalf("a2 after the revision: %+v, %v", a, err)
	}

	hash, err := s.SetDesiredConfigBy(ctx, "a1", "direct: true\n", "token ci")
	if err != nil || hash != ConfigHash("direct: true\n") {
		t.Fatalf("SetDesiredConfigBy: %q, %v", hash, err)
	}
	if got := next(); got != "a1" {
		t.Fatalf("notified %q, want a1", got)
	}
	a, err = AgentAssignment(ctx, s.Pool, "a1")
	if err != nil || a.DesiredConfig != "" || a.DesiredRevision != 0 || a.DesiredHash != hash {
		t.Fatalf("a1 after a direct config: %+v, %v (want no revision, the new hash)", a, err)
	}
	if ag, err := s.GetAgent(ctx, "a1"); err != nil || ag.DesiredSource == nil || *ag.DesiredSource != (DesiredSource{Kind: DesiredDirect, By: "token ci", At: ag.DesiredSource.At}) {
		t.Fatalf("a1's source after a direct config: %+v, %v", ag.DesiredSource, err)
	}
	if _, err := s.SetDesiredConfig(ctx, "a2", ""); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != "a2" {
		t.Fatalf("notified %q, want a2", got)
	}
	if ag, err := s.GetAgent(ctx, "a2"); err != nil || ag.DesiredSource != nil || ag.DesiredConfigHash != ConfigHash("") {
		t.Fatalf("a2 cleared: source %+v, hash %q, %v", ag.DesiredSource, ag.DesiredConfigHash, err)
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
