package store

import (
	"context"
	"errors"
	"io/fs"
	"sync"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/pgtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t *testing.T, dsn string) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := Open(ctx, dsn, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func TestConcurrentMigrationsAndAgentLifecycle(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	// Four replicas start at once: the advisory lock serializes them and
	// each sees the finished schema.
	var wg sync.WaitGroup
	stores := make([]*Store, 4)
	errs := make([]error, 4)
	for i := range stores {
		wg.Go(func() {
			stores[i], errs[i] = Open(ctx, pg.DSN(""), 4, nil)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
		defer stores[i].Close()
	}
	s := stores[0]
	// Each migration applied exactly once.
	files, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatal(files, err)
	}
	var n, distinct int
	if err := s.Pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT version_id) FROM myriarch_schema_version WHERE version_id > 0").Scan(&n, &distinct); err != nil || n != len(files) || distinct != n {
		t.Fatalf("%d migrations applied %d times (%d distinct): %v", len(files), n, distinct, err)
	}

	t0 := time.Now().UTC().Truncate(time.Millisecond)
	created, err := s.Connected(ctx, "a1", "r1", "p1#1", t0)
	if err != nil || !created {
		t.Fatalf("connected: %v %v", created, err)
	}
	healthy := true
	if err := s.UpdateState(ctx, "a1", "p1#1", State{Identifying: map[string]string{"service.name": "bridge"},
		NonIdentifying: map[string]string{"env": "prod"}, Healthy: &healthy}); err != nil {
		t.Fatal(err)
	}
	// The agent moves to replica r2; the old connection's writes are ignored.
	if created, err := s.Connected(ctx, "a1", "r2", "p2#1", t0.Add(time.Second)); err != nil || created {
		t.Fatalf("reconnect: %v %v", created, err)
	}
	if n, err := s.FlushSeen(ctx, []Seen{{UID: "a1", ConnID: "p1#1", At: t0.Add(time.Hour)}}); err != nil || n != 0 {
		t.Fatalf("stale flush wrote %d: %v", n, err)
	}
	if ok, err := s.Disconnected(ctx, "a1", "p1#1", t0); err != nil || ok {
		t.Fatalf("stale disconnect: %v %v", ok, err)
	}
	if uids, err := s.MarkProcessOffline(ctx, "p1#"); err != nil || len(uids) != 0 {
		t.Fatalf("stale process offline: %v %v", uids, err)
	}
	if n, err := s.FlushSeen(ctx, []Seen{{UID: "a1", ConnID: "p2#1", At: t0.Add(time.Minute)}}); err != nil || n != 1 {
		t.Fatalf("flush wrote %d: %v", n, err)
	}
	a, err := s.GetAgent(ctx, "a1")
	if err != nil {
		t.Fatal(err)
	}
	if a.Status != "online" || a.ReplicaID != "r2" || !a.LastSeen.Equal(t0.Add(time.Minute)) || a.Identifying["service.name"] != "bridge" {
		t.Fatalf("agent: %+v", a)
	}
	// A time with a replica moves the agent there (a plain-HTTP agent
	// whose last poll another replica answered); an older one does not.
	if n, err := s.FlushSeen(ctx, []Seen{{UID: "a1", ConnID: "p2#1", At: t0.Add(2 * time.Minute), Replica: "r3"}}); err != nil || n != 1 {
		t.Fatalf("flush with replica wrote %d: %v", n, err)
	}
	if n, err := s.FlushSeen(ctx, []Seen{{UID: "a1", ConnID: "p2#1", At: t0.Add(90 * time.Second), Replica: "r1"}}); err != nil || n != 0 {
		t.Fatalf("older flush with replica wrote %d: %v", n, err)
	}
	if a, err = s.GetAgent(ctx, "a1"); err != nil || a.ReplicaID != "r3" {
		t.Fatalf("agent after a flush with replica: %+v %v", a, err)
	}
	if n, err := s.FlushSeen(ctx, []Seen{{UID: "a1", ConnID: "p2#1", At: t0.Add(3 * time.Minute)}}); err != nil || n != 1 {
		t.Fatalf("flush wrote %d: %v", n, err)
	}
	if a, err = s.GetAgent(ctx, "a1"); err != nil || a.ReplicaID != "r3" {
		t.Fatalf("a flush without replica moved the agent: %+v %v", a, err)
	}
	if _, err := s.Connected(ctx, "a2", "r2", "p2#2", t0); err != nil {
		t.Fatal(err)
	}
	page, next, err := s.ListAgents(ctx, Filter{Selector: map[string]string{"env": "prod"}})
	if err != nil || len(page) != 1 || next != "" || page[0].InstanceUID != "a1" {
		t.Fatalf("selector: %v %q %v", page, next, err)
	}
	page, next, err = s.ListAgents(ctx, Filter{Limit: 1})
	if err != nil || len(page) != 1 || next != "a1" {
		t.Fatalf("paging: %v %q %v", page, next, err)
	}
	page, next, _ = s.ListAgents(ctx, Filter{Limit: 1, After: next})
	if len(page) != 1 || page[0].InstanceUID != "a2" || next != "" {
		t.Fatalf("page 2: %v %q", page, next)
	}
	uids, err := s.MarkProcessOffline(ctx, "p2#")
	if err != nil || len(uids) != 2 {
		t.Fatalf("process offline: %v %v", uids, err)
	}
	c, _ := s.Counts(ctx)
	if c.Total != 2 || c.Offline != 2 {
		t.Fatalf("counts %+v", c)
	}
	if err := s.InsertEvents(ctx, []Event{{InstanceUID: "a1", At: t0, Kind: EventConnected, ReplicaID: "r1"}}); err != nil {
		t.Fatal(err)
	}
	evs, err := s.Events(ctx, "a1", 10)
	if err != nil || len(evs) != 1 || evs[0].Kind != EventConnected {
		t.Fatalf("events %v %v", evs, err)
	}
	if _, err := s.SetDesiredConfig(ctx, "nope", "x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("desired on unknown agent: %v", err)
	}
	h, err := s.SetDesiredConfig(ctx, "a1", "receivers: {}")
	if err != nil || h != ConfigHash("receivers: {}") {
		t.Fatal(err)
	}
	d, err := s.DesiredConfigs(ctx, []string{"a1", "a2"})
	if err != nil || len(d) != 1 || d["a1"].Hash != h {
		t.Fatalf("desired %v %v", d, err)
	}
}

func TestTokensAreStoredHashed(t *testing.T) {
	pg := pgtest.New(t)
	s := open(t, pg.DSN(""))
	ctx := context.Background()
	tok, err := s.CreateToken(ctx, "admin")
	if err != nil {
		t.Fatal(err)
	}
	var n int
	s.Pool.QueryRow(ctx, "SELECT count(*) FROM api_tokens WHERE position($1::bytea in hash) > 0", []byte(tok)).Scan(&n)
	if n != 0 {
		t.Fatal("token stored in clear")
	}
	if name, ok, err := s.VerifyToken(ctx, tok); !ok || err != nil || name != "admin" {
		t.Fatalf("verify: %q %v %v", name, ok, err)
	}
	if _, ok, _ := s.VerifyToken(ctx, tok+"x"); ok {
		t.Fatal("wrong token accepted")
	}
}
