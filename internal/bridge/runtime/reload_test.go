package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/runtime"
	"github.com/myriarch/myriarch/internal/testwait"
)

// connects counts the broker sessions established per client ID.
type connects struct {
	mochi.HookBase
	mu sync.Mutex
	n  map[string]int
}

func (*connects) ID() string { return "test-connects" }

func (*connects) Provides(b byte) bool { return b == mochi.OnSessionEstablished }

func (c *connects) OnSessionEstablished(cl *mochi.Client, _ packets.Packet) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[cl.ID]++
}

func (c *connects) count(prefix string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	total := 0
	for id, n := range c.n {
		if strings.HasPrefix(id, prefix) {
			total += n
		}
	}
	return total
}

// secondRoute adds a route with its own sender on the exclusive session's
// receiver: the session's settings and subscriptions do not change.
const secondRoute = `
  - {id: second, type: http, http: {url: "SINK2"}, retry: {max_attempts: 10, initial_backoff: 10ms}}
routes:
  - id: r2
    receiver: in
    senders: [second]
    lease_ttl: 5s
    step_down_grace: 1s
    broker_health_step_down: 2s
    failover_slo: 60s`

func reloadCfg(t *testing.T, dir, id, broker, sinkURL string, edit func(string) string) *config.Config {
	t.Helper()
	y := strings.NewReplacer("INSTANCE", id, "DIR", dir, "BROKER", broker, "SINK", sinkURL).Replace(cfgTemplate)
	y = edit(y)
	cfg, err := config.Parse(filepath.Join(dir, id+".yaml"), []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func longKeepAlive(y string) string {
	return strings.Replace(y, "keep_alive: 1s", "keep_alive: 10s", 1)
}

func leaseVersion(in *instance) int64 { return in.b.Status().Sessions[0].LeaseVersion }

// A reload that adds a route keeps the exclusive session where it is: same
// owner, same lease version, no new broker connection; messages published
// across the reload all arrive, and the new route delivers from then on.
func TestReloadAddingRouteKeepsLeaseAndConnection(t *testing.T) {
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	hook := &connects{n: map[string]int{}}
	if err := br.Server.AddHook(hook, nil); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sk, sk2 := newSink(t), newSink(t)
	// A keep-alive long enough that a loaded machine's late PINGREQ does
	// not cost a reconnect, which would be counted against the reload.
	a := startWith(t, longKeepAlive(cfgTemplate), dir, "a", br.URL, sk.srv.URL, runtime.Options{})
	testwait.Until(t, "a owns and serves", waitLimit, func() bool { return role(a) == "owner/full" })
	b := startWith(t, longKeepAlive(cfgTemplate), dir, "b", br.URL, sk.srv.URL, runtime.Options{})
	testwait.Until(t, "b standby", waitLimit, func() bool { return role(b) == "standby/none" })
	version, conns := leaseVersion(a), hook.count("plant-bridge")

	p := publisher(t, br.URL)
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		pub(t, p, 0, 400)
	}()
	add := func(y string) string {
		y = longKeepAlive(y)
		y = strings.Replace(y, "\nroutes:", secondRoute, 1)
		return strings.ReplaceAll(y, "SINK2", sk2.srv.URL)
	}
	for _, in := range []*instance{a, b} {
		d, err := in.b.Reload(context.Background(), reloadCfg(t, dir, in.b.InstanceID(), br.URL, sk.srv.URL, add))
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(d.Kept, d.Changed, d.Added, d.SendersChanged) != "[plant] [] [] [second]" {
			t.Fatalf("diff: kept %v changed %v added %v senders %v", d.Kept, d.Changed, d.Added, d.SendersChanged)
		}
	}
	<-pubDone
	pub(t, p, 400, 500)
	testwait.Until(t, "all 500 at the first sink", waitLimit, func() bool { return sk.has(500) })
	testwait.Until(t, "the new route delivers", waitLimit, func() bool {
		sk2.mu.Lock()
		defer sk2.mu.Unlock()
		return sk2.seen["499"] > 0
	})
	if role(a) != "owner/full" || role(b) != "standby/none" {
		t.Fatalf("roles after the reload: a %s, b %s", role(a), role(b))
	}
	if v := leaseVersion(a); v != version {
		t.Fatalf("lease version %d after the reload, was %d", v, version)
	}
	if n := hook.count("plant-bridge"); n != conns {
		t.Fatalf("%d broker sessions after the reload, %d before: the session reconnected", n, conns)
	}
	if got := a.b.Status().Sessions[0].Routes; fmt.Sprint(got) != "[r2 r]" {
		t.Fatalf("routes after the reload: %v", got)
	}
}

// A reload that changes the exclusive session's cadence steps the owner
// down once: the lease moves on to a new version and nothing published
// across the hand-over is lost.
func TestReloadChangedCadenceHandsOverOnce(t *testing.T) {
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	dir := t.TempDir()
	sk := newSink(t)
	a := start(t, dir, "a", br.URL, sk.srv.URL)
	testwait.Until(t, "a owns and serves", waitLimit, func() bool { return role(a) == "owner/full" })
	b := start(t, dir, "b", br.URL, sk.srv.URL)
	testwait.Until(t, "b standby", waitLimit, func() bool { return role(b) == "standby/none" })
	version := leaseVersion(a)
	p := publisher(t, br.URL)
	pub(t, p, 0, 100)

	ttl := func(y string) string { return strings.Replace(y, "lease_ttl: 5s", "lease_ttl: 6s", 1) }
	// The standby first (it only restarts its standing by), then the owner.
	for _, in := range []*instance{b, a} {
		d, err := in.b.Reload(context.Background(), reloadCfg(t, dir, in.b.InstanceID(), br.URL, sk.srv.URL, ttl))
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(d.Changed, d.Kept) != "[plant] []" {
			t.Fatalf("diff: changed %v kept %v", d.Changed, d.Kept)
		}
	}
	pub(t, p, 100, 200)
	var owner *instance
	testwait.Until(t, "one owner at full again", waitLimit, func() bool {
		switch {
		case role(a) == "owner/full":
			owner = a
		case role(b) == "owner/full":
			owner = b
		default:
			return false
		}
		return true
	})
	if v := leaseVersion(owner); v != version+1 {
		t.Fatalf("lease version %d after the reload, was %d: want exactly one hand-over", v, version)
	}
	testwait.Until(t, "all 200 delivered", waitLimit, func() bool { return sk.has(200) })
	if got := owner.b.Config().Exclusive[0].Assessment.Cadence.LeaseTTL.String(); got != "6s" {
		t.Fatalf("running lease_ttl %s", got)
	}
}

// A reload that changes a setting only a restart can change is refused
// whole: nothing changes, and the error names the field.
func TestReloadRefusesRestartSettings(t *testing.T) {
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	dir := t.TempDir()
	sk := newSink(t)
	a := start(t, dir, "a", br.URL, sk.srv.URL)
	testwait.Until(t, "a owns and serves", waitLimit, func() bool { return role(a) == "owner/full" })
	version := leaseVersion(a)
	before := a.b.Config()
	cfg := reloadCfg(t, dir, "a", br.URL, sk.srv.URL, func(y string) string {
		y = strings.Replace(y, "id: t\n", "id: other\n", 1)
		return strings.Replace(y, "lease_ttl: 5s", "lease_ttl: 6s", 1)
	})
	_, err = a.b.Reload(context.Background(), cfg)
	var ps config.Problems
	if !errors.As(err, &ps) || !strings.Contains(err.Error(), `bridge.id: other: differs from the running configuration (t)`) {
		t.Fatalf("want a refusal naming bridge.id, got %v", err)
	}
	if a.b.Config() != before || leaseVersion(a) != version || role(a) != "owner/full" {
		t.Fatal("a refused reload changed the bridge")
	}
}

// A reload that drops a filter unsubscribes it: the session changes, and
// its next connection (same broker session) unsubscribes what it no
// longer wants.
func TestReloadUnsubscribesRemovedFilters(t *testing.T) {
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	dir := t.TempDir()
	sk := newSink(t)
	a := start(t, dir, "a", br.URL, sk.srv.URL)
	testwait.Until(t, "a owns and serves", waitLimit, func() bool { return role(a) == "owner/full" })
	subscribed := func(topic string) bool {
		_, ok := br.Server.Topics.Subscribers(topic).Subscriptions["plant-bridge"]
		return ok
	}
	if !subscribed("in/x") {
		t.Fatal("in/# not subscribed at the start")
	}
	version := leaseVersion(a)
	cfg := reloadCfg(t, dir, "a", br.URL, sk.srv.URL, func(y string) string {
		return strings.Replace(y, `filter: "in/#"`, `filter: "in/a/#"`, 1)
	})
	d, err := a.b.Reload(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(d.Changed) != "[plant]" {
		t.Fatalf("diff: changed %v", d.Changed)
	}
	testwait.Until(t, "a serves the new filter", waitLimit, func() bool {
		return role(a) == "owner/full" && leaseVersion(a) > version && subscribed("in/a/1")
	})
	if subscribed("in/x") {
		t.Fatal("the removed filter in/# is still subscribed")
	}
}

// A reload that changes a route's spool (its bound, its directory) gets a
// spool with the new settings: the session changes, the tenure's spool
// closes (its lock released) and the next tenure opens the new one.
// Before, the kept session went on with the spool it held open, the
// reload reported success, and the new settings were ignored until a
// restart.
func TestReloadChangedSpoolReopensIt(t *testing.T) {
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	dir := t.TempDir()
	sk := newSink(t)
	withSpool := func(sdir string) func(string) string {
		return func(y string) string {
			return strings.Replace(y, "    failover_slo: 60s", "    failover_slo: 60s\n    spool: {dir: "+sdir+", max_messages: 100}", 1)
		}
	}
	a := startWith(t, withSpool(dir+"/one")(cfgTemplate), dir, "a", br.URL, sk.srv.URL, runtime.Options{})
	spoolDir := func() string {
		sp := a.b.Status().Sessions[0].Spools
		if len(sp) != 1 {
			return ""
		}
		return sp[0].Dir
	}
	testwait.Until(t, "a serves from spool one", waitLimit, func() bool { return role(a) == "owner/full" && spoolDir() == dir+"/one" })
	d, err := a.b.Reload(context.Background(), reloadCfg(t, dir, "a", br.URL, sk.srv.URL, withSpool(dir+"/two")))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(d.Changed) != "[plant]" {
		t.Fatalf("diff: kept %v changed %v", d.Kept, d.Changed)
	}
	testwait.Until(t, "a serves from spool two", waitLimit, func() bool { return role(a) == "owner/full" && spoolDir() == dir+"/two" })
	p := publisher(t, br.URL)
	pub(t, p, 0, 20)
	testwait.Until(t, "all 20 at the sink", waitLimit, func() bool { return sk.has(20) })
}
