package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/outbox"
	"github.com/myriarch/myriarch/internal/bridge/runtime"
	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/internal/testwait"
	"github.com/myriarch/myriarch/lease/pgstore"
)

// childSpools reads the spools of the child's session from its /status.
func childSpools(c *child) []runtime.SpoolStatus {
	cl := http.Client{Timeout: time.Second}
	resp, err := cl.Get("http://" + c.addr + "/status")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var st runtime.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || len(st.Sessions) == 0 {
		return nil
	}
	return st.Sessions[0].Spools
}

// Two bridge processes on one PostgreSQL, the route with
// `spool: {backend: postgres}`: the owner (a child process) takes every
// message into the outbox while the destination is down (the source is
// acknowledged), and is killed (SIGKILL) with them there. The standby
// takes the lease over at a higher version, opens the outbox, and once
// the destination is back delivers every one of them.
func TestOutboxSurvivesOwnerKill(t *testing.T) {
	t.Parallel()
	const n = 300
	pg := pgtest.New(t)
	dsn := pg.DSN("")
	store, err := pgstore.OpenDSN(context.Background(), dsn, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	storeYAML := fmt.Sprintf("{type: postgres, dsn: %q}", dsn)

	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = br.Close() })
	dir := t.TempDir()
	dst := newOutageSink(t)
	dst.down.Store(true)
	withOutbox := strings.NewReplacer(
		"retry: {max_attempts: 10, initial_backoff: 10ms}", "retry: {max_attempts: 1000000, initial_backoff: 10ms, max_backoff: 50ms}",
		"    failover_slo: 60s\n", "    failover_slo: 60s\n    max_in_flight: 5\n    spool: {backend: postgres, max_messages: 100000}\n")
	write := func(id, httpAddr string) string {
		path, _ := clusteredConfig(t, dir, id, httpAddr, storeYAML, br.URL, dst.srv.URL)
		return path
	}
	pathA := write("a", "127.0.0.1:0")
	rewriteConfig(t, pathA, withOutbox)
	a := startChild(t, pathA)
	testwait.Until(t, "a owns and serves", waitLimit, func() bool { return a.role() == "owner/full" })

	p := publisher(t, br.URL)
	pub(t, p, 0, n)
	testwait.Until(t, "a's outbox holding every message", waitLimit, func() bool {
		sp := childSpools(a)
		return len(sp) == 1 && sp[0].Backend == "postgres" && sp[0].Table == outbox.Table && sp[0].Messages == n
	})
	before, err := store.Current(context.Background(), "t/plant")
	if err != nil {
		t.Fatal(err)
	}
	a.kill(t)

	pathB := write("b", "off")
	cfgB := rewriteConfig(t, pathB, withOutbox)
	bb := startClustered(t, cfgB, nil)
	testwait.Until(t, "b owns", waitLimit, func() bool { return strings.HasPrefix(role(bb), "owner") })
	testwait.Until(t, "b's outbox holding a's messages", waitLimit, func() bool {
		sp := bb.b.Status().Sessions[0].Spools
		return len(sp) == 1 && sp[0].Recovered == n
	})
	st := bb.b.Status().Sessions[0]
	if st.Spools[0].LeaseVersion <= before.Version || st.Spools[0].LeaseVersion != st.LeaseVersion {
		t.Fatalf("b's outbox at version %d, a's lease was %d, b's is %d", st.Spools[0].LeaseVersion, before.Version, st.LeaseVersion)
	}
	dst.down.Store(false)
	testwait.Until(t, "every message delivered", waitLimit, func() bool { return dst.distinct() == n })
	testwait.Until(t, "b's outbox empty", waitLimit, func() bool { return bb.b.Status().Sessions[0].Spools[0].Messages == 0 })
}

// rewriteConfig applies r to the configuration file at path and parses
// the result.
func rewriteConfig(t *testing.T, path string, r *strings.Replacer) *config.Config {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	y := r.Replace(string(b))
	if y == string(b) {
		t.Fatal("the configuration template changed: nothing to rewrite")
	}
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(path, []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
