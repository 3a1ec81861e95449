package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/health"
	"github.com/myriarch/myriarch/internal/bridge/runtime"
	"github.com/myriarch/myriarch/internal/faultnet"
	"github.com/myriarch/myriarch/internal/testwait"
	"github.com/myriarch/myriarch/lease"
)

func TestMain(m *testing.M) {
	if path := os.Getenv(childConfigEnv); path != "" {
		os.Exit(runChild(path))
	}
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/mochi-mqtt/server/v2.(*Server).eventLoop"),
		// database/sql's connection opener lives as long as the *sql.DB's
		// process-wide driver bookkeeping.
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
	)
}

// waitLimit bounds the waits of this package's tests (testwait.Until).
const waitLimit = 30 * time.Second

// sink is an HTTP sender's destination that records payloads.
type sink struct {
	mu   sync.Mutex
	seen map[string]int
	srv  *httptest.Server
}

func newSink(t *testing.T) *sink {
	s := &sink{seen: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.seen[string(b)]++
		s.mu.Unlock()
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *sink) has(n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range n {
		if s.seen[fmt.Sprint(i)] == 0 {
			return false
		}
	}
	return true
}

const cfgTemplate = `
bridge:
  id: t
  instance_id: INSTANCE
  shutdown_timeout: 5s
  http: {listen: "off"}
  dead_letter: {path: DIR/dl.jsonl}
stores:
  lease: {type: sqlite, path: DIR/lease.db}
sessions:
  - id: plant
    session_mode: exclusive
    brokers: ["BROKER"]
    client_id: plant-bridge
    keep_alive: 1s
    connect_timeout: 1s
    reconcile_timeout: 1s
    unmatched_grace: 1s
receivers:
  - {id: in, session: plant, topics: [{filter: "in/#", qos: 1}]}
senders:
  - {id: sink, type: http, http: {url: "SINK"}, retry: {max_attempts: 10, initial_backoff: 10ms}}
routes:
  - id: r
    receiver: in
    senders: [sink]
    lease_ttl: 5s
    step_down_grace: 1s
    broker_health_step_down: 2s
    failover_slo: 60s
`

type instance struct {
	b      *runtime.Bridge
	cancel context.CancelFunc
	done   chan error
	reg    *prometheus.Registry
}

func start(t *testing.T, dir, id, broker, sinkURL string) *instance {
	t.Helper()
	y := strings.NewReplacer("INSTANCE", id, "DIR", dir, "BROKER", broker, "SINK", sinkURL).Replace(cfgTemplate)
	cfg, err := config.Parse(filepath.Join(dir, id+".yaml"), []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("test_instance", id)
	b, err := runtime.New(context.Background(), cfg, runtime.Options{Logger: log, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{b: b, cancel: cancel, done: make(chan error, 1), reg: reg}
	go func() { in.done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-in.done:
		case <-time.After(20 * time.Second):
			t.Error("bridge did not stop")
		}
	})
	return in
}

func role(in *instance) string {
	s := in.b.Status().Sessions[0]
	return s.Role + "/" + s.ServiceLevel
}

func publisher(t *testing.T, url string) *embroker.Client {
	t.Helper()
	c, err := embroker.Connect(context.Background(), url, fmt.Sprintf("pub-%d", time.Now().UnixNano()), true, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func pub(t *testing.T, c *embroker.Client, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if _, err := c.Publish(context.Background(), &paho.Publish{Topic: "in/x", QoS: 1, Payload: fmt.Append(nil, i)}); err != nil {
			t.Fatal(err)
		}
	}
}

// A planned stop of the owner releases the lease; the standby takes over,
// resumes the broker session and receives what was queued meanwhile.
func TestTakeoverResumesQueuedMessages(t *testing.T) {
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	dir := t.TempDir()
	sk := newSink(t)
	a := start(t, dir, "a", br.URL, sk.srv.URL)
	testwait.Until(t, "a owns and serves", waitLimit, func() bool { return role(a) == "owner/full" })
	bb := start(t, dir, "b", br.URL, sk.srv.URL)
	testwait.Until(t, "b standby", waitLimit, func() bool { return role(bb) == "standby/none" })
	if !a.b.Ready() || !bb.b.Ready() {
		t.Fatal("owner at full and standby must both be ready")
	}
	p := publisher(t, br.URL)
	pub(t, p, 0, 50)
	testwait.Until(t, "first 50", waitLimit, func() bool { return sk.has(50) })
	// Let b observe a few of a's renewals (renew_interval ~0.56s here):
	// failure-to-full is anchored on the last one it saw.
	time.Sleep(3 * time.Second)

	a.cancel()
	if err := <-a.done; err != nil {
		t.Fatalf("planned stop: %v", err)
	}
	a.done <- nil
	pub(t, p, 50, 100) // queued in the broker session until b resumes it
	testwait.Until(t, "b owns and serves", waitLimit, func() bool { return role(bb) == "owner/full" })
	testwait.Until(t, "all 100 delivered", waitLimit, func() bool { return sk.has(100) })
	if n := testutil.CollectAndCount(bb.reg, "myriarch_bridge_failover_takeover_to_full_seconds"); n != 1 {
		t.Fatalf("takeover histogram series: %d", n)
	}
	if n := testutil.CollectAndCount(bb.reg, "myriarch_bridge_failover_failure_to_full_seconds"); n != 1 {
		t.Fatalf("failure-to-full histogram series: %d", n)
	}
	st := bb.b.Status().Sessions[0]
	if st.LeaseVersion < 2 || st.Budget == nil || st.Budget.OwnerDeathBudget == nil {
		t.Fatalf("status: %+v", st)
	}
	// Failure-to-full starts before the lease was won, so it bounds
	// takeover-to-full from above.
	if st.FailureToFull == nil || st.TakeoverToFull == nil || *st.FailureToFull < *st.TakeoverToFull {
		t.Fatalf("failure-to-full %v, takeover-to-full %v", st.FailureToFull, st.TakeoverToFull)
	}
}

// An owner whose broker path is blackholed (lease store still reachable)
// steps down after broker_health_step_down; that is terminal for it, and
// the standby takes over with nothing lost.
func TestBrokerPathStepDown(t *testing.T) {
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	px, err := faultnet.Listen(faultnet.Options{}, br.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	dir := t.TempDir()
	sk := newSink(t)
	a := start(t, dir, "a", "tcp://"+px.Addr(), sk.srv.URL)
	testwait.Until(t, "a owns and serves", waitLimit, func() bool { return role(a) == "owner/full" })
	bb := start(t, dir, "b", br.URL, sk.srv.URL)
	testwait.Until(t, "b standby", waitLimit, func() bool { return role(bb) == "standby/none" })
	p := publisher(t, br.URL)
	pub(t, p, 0, 20)
	testwait.Until(t, "first 20", waitLimit, func() bool { return sk.has(20) })

	px.Blackhole(true)
	pub(t, p, 20, 40)
	var runErr error
	select {
	case runErr = <-a.done:
		a.done <- runErr
	case <-time.After(30 * time.Second):
		t.Fatal("owner did not step down")
	}
	if !errors.Is(runErr, lease.ErrDependencyStepDown) {
		t.Fatalf("owner returned %v, want the terminal step-down", runErr)
	}
	if got := testutil.ToFloat64(mustGet(t, a.reg, "myriarch_bridge_broker_health_step_down_total")); got != 1 {
		t.Fatalf("step-down count %v", got)
	}
	testwait.Until(t, "b owns and serves", waitLimit, func() bool { return role(bb) == "owner/full" })
	pub(t, p, 40, 60)
	testwait.Until(t, "all 60 delivered", waitLimit, func() bool { return sk.has(60) })
}

func mustGet(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
			var v float64
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
			g.Set(v)
			return g
		}
	}
	t.Fatalf("metric %s not found", name)
	return nil
}

// The health endpoints report liveness, readiness, status and metrics.
func TestHealthEndpoints(t *testing.T) {
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	dir := t.TempDir()
	sk := newSink(t)
	a := start(t, dir, "a", br.URL, sk.srv.URL)
	testwait.Until(t, "a owns and serves", waitLimit, func() bool { return role(a) == "owner/full" })
	srv, err := health.Listen("127.0.0.1:0", health.Handler(a.b, a.reg))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + srv.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/live"); code != 200 {
		t.Fatalf("/live %d", code)
	}
	testwait.Until(t, "ready", waitLimit, func() bool { code, _ := get("/ready"); return code == 200 })
	_, body := get("/status")
	for _, want := range []string{`"role": "owner"`, `"service_level": "full"`, `"owner_death_budget_s"`, `"lease_version": 1`} {
		if !strings.Contains(body, want) {
			t.Errorf("/status lacks %s:\n%s", want, body)
		}
	}
	_, m := get("/metrics")
	for _, want := range []string{`myriarch_bridge_service_level{session="plant"} 2`, `myriarch_bridge_failover_takeover_to_full_seconds_bucket`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// A persistent, non-exclusive session serves without a lease, routes
// through a file sender with a topic rewrite, and stops gracefully.
func TestPersistentSessionToFile(t *testing.T) {
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	dir := t.TempDir()
	y := strings.NewReplacer("DIR", dir, "BROKER", br.URL).Replace(`
bridge: {id: p, instance_id: i, http: {listen: "off"}, dead_letter: {path: DIR/dl.jsonl}}
sessions:
  - {id: s, session_mode: persistent, brokers: ["BROKER"], connect_timeout: 1s, reconcile_timeout: 1s, unmatched_grace: 1s}
receivers:
  - {id: r, session: s, topics: [{filter: "plant/#"}]}
senders:
  - {id: f, type: file, file: {path: DIR/out.jsonl}}
routes:
  - {id: rt, receiver: r, senders: [f], rewrite: {strip_prefix: "plant/", add_prefix: "site/"}}
`)
	cfg, err := config.Parse(filepath.Join(dir, "p.yaml"), []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	b, err := runtime.New(context.Background(), cfg, runtime.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	testwait.Until(t, "active and full", waitLimit, func() bool { s := b.Status().Sessions[0]; return s.Role+"/"+s.ServiceLevel == "active/full" })
	p := publisher(t, br.URL)
	for i := range 10 {
		if _, err := p.Publish(context.Background(), &paho.Publish{Topic: "plant/m1", QoS: 1, Payload: fmt.Append(nil, i)}); err != nil {
			t.Fatal(err)
		}
	}
	testwait.Until(t, "10 lines", waitLimit, func() bool {
		data, _ := os.ReadFile(filepath.Join(dir, "out.jsonl"))
		return strings.Count(string(data), "\n") == 10
	})
	data, _ := os.ReadFile(filepath.Join(dir, "out.jsonl"))
	if !strings.Contains(string(data), `"topic":"site/m1"`) || !strings.Contains(string(data), `"source_topic":"plant/m1"`) {
		t.Fatalf("file: %s", data)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
