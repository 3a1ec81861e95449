package routing_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	natsserver "github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	filesender "github.com/myriarch/myriarch/internal/bridge/sender/file"
	httpsender "github.com/myriarch/myriarch/internal/bridge/sender/http"
	kafkasender "github.com/myriarch/myriarch/internal/bridge/sender/kafka"
	mqttsender "github.com/myriarch/myriarch/internal/bridge/sender/mqtt"
	natssender "github.com/myriarch/myriarch/internal/bridge/sender/nats"
	"github.com/myriarch/myriarch/internal/bridge/transport"
	"github.com/myriarch/myriarch/internal/bridge/transport/mqtt"
	"github.com/myriarch/myriarch/internal/testwait"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// mochi and nats-server keep process-wide helpers after Close.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
		goleak.IgnoreTopFunction("github.com/mochi-mqtt/server/v2.(*Server).eventLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

// waitLimit bounds the waits of this package's tests (testwait.Until).
const waitLimit = 20 * time.Second

func startBroker(t *testing.T) *embroker.Broker {
	t.Helper()
	b, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// runSession runs a bridge session on broker with the dispatcher of routes.
func runSession(t *testing.T, ctx context.Context, url, clientID string, filter string, d *routing.Dispatcher) (*mqtt.Session, func()) {
	t.Helper()
	s, err := mqtt.New(transport.Config{Brokers: []string{url}, ClientID: clientID, SessionExpiry: time.Hour, KeepAlive: 30 * time.Second,
		ConnectTimeout: 5 * time.Second, ReconcileTimeout: 5 * time.Second, UnmatchedGrace: time.Second, ReceiveMaximum: 1000,
		Subscriptions: []transport.Subscription{{Filter: filter, QoS: 1}}, Handler: d.Handle})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	testwait.Until(t, "session full", waitLimit, func() bool { return s.Level() == transport.LevelFull })
	return s, func() { cancel(); <-done }
}

func publish(t *testing.T, url string, n int, topic func(i int) string) {
	t.Helper()
	ctx := context.Background()
	pub, err := embroker.Connect(ctx, url, fmt.Sprintf("pub-%d", time.Now().UnixNano()), true, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for i := range n {
		if _, err := pub.Publish(ctx, &paho.Publish{Topic: topic(i), QoS: 1, Payload: fmt.Appendf(nil, "%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRoutesToEverySenderInOrder(t *testing.T) {
	const n = 200
	src, dst := startBroker(t), startBroker(t)
	ctx := context.Background()

	// MQTT sink on the target broker.
	var mqttGot []string
	var mu sync.Mutex
	sub, err := embroker.Connect(ctx, dst.URL, "sink", true, func(p *paho.Publish) {
		mu.Lock()
		mqttGot = append(mqttGot, p.Topic+"="+string(p.Payload))
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.Subscribe(ctx, "out/#", 1); err != nil {
		t.Fatal(err)
	}

	// HTTP sink.
	var httpGot []string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		httpGot = append(httpGot, r.Header.Get("X-Myriarch-Topic")+"="+string(b)+"|"+r.Header.Get("X-Site"))
		mu.Unlock()
	}))
	defer hs.Close()

	// NATS sink.
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	nc, err := natsgo.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var natsGot []string
	if _, err := nc.Subscribe("bridge.>", func(m *natsgo.Msg) {
		mu.Lock()
		natsGot = append(natsGot, m.Subject+"="+string(m.Data))
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()

	// Kafka sink.
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "mqtt"))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()

	dir := t.TempDir()
	fileS, err := filesender.Open(filepath.Join(dir, "out.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	natsS, err := natssender.Dial(natssender.Config{URL: ns.ClientURL(), SubjectPrefix: "bridge", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	kafkaS, err := kafkasender.Dial(kafkasender.Config{Brokers: kc.ListenAddrs(), Topic: "mqtt", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	senders := map[string]sender.Sender{
		"mqtt":  mqttsender.New(mqttsender.Config{Broker: dst.URL, ClientID: "bridge-out", QoS: 1, KeepAlive: 30 * time.Second}),
		"http":  httpsender.New(httpsender.Config{URL: hs.URL, Headers: map[string]string{"X-Site": "s1"}, Timeout: 5 * time.Second}),
		"nats":  natsS,
		"kafka": kafkaS,
		"file":  fileS,
	}
	var targets []routing.Target
	for id, s := range senders {
		targets = append(targets, routing.Target{ID: id, Sender: s, MaxAttempts: 3})
	}
	route := routing.NewRoute(routing.RouteConfig{ID: "r1", Filters: []string{"in/#"}, Targets: targets, MaxInFlight: 50,
		StripPrefix: "in/", AddPrefix: "out/", DeadLetter: routing.OpenDeadLetter(filepath.Join(dir, "dl.jsonl"))})
	_, stop := runSession(t, ctx, src.URL, "bridge-in", "in/#", &routing.Dispatcher{Session: "s", Routes: []*routing.Route{route}})

	publish(t, src.URL, n, func(i int) string { return "in/a" })
	testwait.Until(t, "every sink", waitLimit, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(mqttGot) == n && len(httpGot) == n && len(natsGot) == n
	})
	testwait.Until(t, "route idle", waitLimit, func() bool { return route.InFlight() == 0 })
	stop()
	route.Close()
	for _, s := range senders {
		if err := s.Close(ctx); err != nil {
			t.Error(err)
		}
	}
	mu.Lock()
	for i := range n {
		if want := fmt.Sprintf("out/a=%d", i); mqttGot[i] != want {
			t.Fatalf("mqtt sink #%d = %q, want %q (order)", i, mqttGot[i], want)
		}
		if want := fmt.Sprintf("out/a=%d|s1", i); httpGot[i] != want {
			t.Fatalf("http sink #%d = %q, want %q", i, httpGot[i], want)
		}
		if want := fmt.Sprintf("bridge.out.a=%d", i); natsGot[i] != want {
			t.Fatalf("nats sink #%d = %q, want %q", i, natsGot[i], want)
		}
	}
	mu.Unlock()

	lines := readLines(t, filepath.Join(dir, "out.jsonl"))
	if len(lines) != n {
		t.Fatalf("file sink has %d lines", len(lines))
	}
	var l filesender.Line
	if err := json.Unmarshal([]byte(lines[n-1]), &l); err != nil || l.Topic != "out/a" || string(l.Payload) != fmt.Sprint(n-1) || l.SourceTopic != "in/a" {
		t.Fatalf("file line %q: %v", lines[n-1], err)
	}

	cons, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.ConsumeTopics("mqtt"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	var kafkaGot []string
	for len(kafkaGot) < n {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		fs := cons.PollFetches(pctx)
		timedOut := pctx.Err() != nil
		cancel()
		if timedOut {
			t.Fatalf("kafka: %d records", len(kafkaGot))
		}
		fs.EachError(func(topic string, p int32, err error) { t.Logf("fetch %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) { kafkaGot = append(kafkaGot, string(r.Key)+"="+string(r.Value)) })
	}
	for i := range n {
		if want := fmt.Sprintf("out/a=%d", i); kafkaGot[i] != want {
			t.Fatalf("kafka #%d = %q, want %q", i, kafkaGot[i], want)
		}
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// flaky fails its first failures calls, then accepts.
type flaky struct {
	failures atomic.Int32
	accepted atomic.Int32
	calls    atomic.Int32
}

func (f *flaky) Send(m *sender.Message, done func(error)) {
	f.calls.Add(1)
	if f.failures.Add(-1) >= 0 {
		done(fmt.Errorf("injected failure"))
		return
	}
	f.accepted.Add(1)
	done(nil)
}
func (f *flaky) Close(context.Context) error { return nil }

func TestRetryThenDeadLetterThenAck(t *testing.T) {
	src := startBroker(t)
	ctx := context.Background()
	dir := t.TempDir()
	dlPath := filepath.Join(dir, "dl.jsonl")
	retried := &flaky{}
	retried.failures.Store(2) // first message fails twice, then succeeds
	broken := &flaky{}
	broken.failures.Store(1 << 30)
	dl := routing.OpenDeadLetter(dlPath)
	defer dl.Close()
	route := routing.NewRoute(routing.RouteConfig{ID: "r", Filters: []string{"t/#"}, DeadLetter: dl, Targets: []routing.Target{
		{ID: "retried", Sender: retried, MaxAttempts: 5, InitialBackoff: time.Millisecond},
		{ID: "broken", Sender: broken, MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond},
	}})
	defer route.Close()
	var acked atomic.Int32
	d := &routing.Dispatcher{Session: "s", Routes: []*routing.Route{route}}
	_, stop := runSession(t, ctx, src.URL, "bridge-dl", "t/#", &routing.Dispatcher{Session: "s", Routes: d.Routes})
	defer stop()
	publish(t, src.URL, 3, func(i int) string { return "t/x" })
	testwait.Until(t, "all settled", waitLimit, func() bool { return route.InFlight() == 0 && len(readLinesMaybe(dlPath)) == 3 })
	_ = acked.Load()
	if retried.accepted.Load() != 3 {
		t.Fatalf("retried sender accepted %d", retried.accepted.Load())
	}
	for _, l := range readLinesMaybe(dlPath) {
		var e routing.DeadLetterEntry
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatal(err)
		}
		if e.Sender != "broken" || e.Attempts != 3 || e.Reason != "3 attempts failed; last error: injected failure" {
			t.Fatalf("dead letter: %+v", e)
		}
	}
}

func readLinesMaybe(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	sc := bufio.NewScanner(bufioReader(b))
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// hold never completes: messages stay in flight.
type hold struct{ n atomic.Int32 }

func (h *hold) Send(*sender.Message, func(error)) { h.n.Add(1) }
func (h *hold) Close(context.Context) error       { return nil }

// TestUnacknowledgedRedeliveredOnResume: what one session did not settle,
// and what was published while nobody was connected, reaches the next
// session with the same client_id (clean_start false).
func TestUnacknowledgedRedeliveredOnResume(t *testing.T) {
	src := startBroker(t)
	ctx := context.Background()
	h := &hold{}
	r1 := routing.NewRoute(routing.RouteConfig{ID: "r", Filters: []string{"q/#"}, MaxInFlight: 10, Targets: []routing.Target{{ID: "hold", Sender: h}}})
	_, stop := runSession(t, ctx, src.URL, "shared-id", "q/#", &routing.Dispatcher{Routes: []*routing.Route{r1}})
	publish(t, src.URL, 5, func(i int) string { return "q/x" })
	testwait.Until(t, "held", waitLimit, func() bool { return h.n.Load() == 5 })
	r1.Close()
	stop()
	publish(t, src.URL, 5, func(i int) string { return "q/x" }) // queued in the broker session

	got := &flaky{}
	r2 := routing.NewRoute(routing.RouteConfig{ID: "r", Filters: []string{"q/#"}, Targets: []routing.Target{{ID: "ok", Sender: got}}})
	defer r2.Close()
	s2, stop2 := runSession(t, ctx, src.URL, "shared-id", "q/#", &routing.Dispatcher{Routes: []*routing.Route{r2}})
	defer stop2()
	testwait.Until(t, "redelivery", waitLimit, func() bool { return got.accepted.Load() >= 10 })
	if !s2.SessionPresent() {
		t.Fatal("the broker did not resume the session")
	}
}

func bufioReader(b []byte) io.Reader { return bytesReader(b) }

// release is a sender whose messages stay in flight until released.
type release struct {
	mu    sync.Mutex
	dones []func(error)
}

func (r *release) Send(_ *sender.Message, done func(error)) {
	r.mu.Lock()
	r.dones = append(r.dones, done)
	r.mu.Unlock()
}
func (r *release) Close(context.Context) error { return nil }
func (r *release) held() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.dones)
}
func (r *release) releaseAll() {
	r.mu.Lock()
	d := r.dones
	r.dones = nil
	r.mu.Unlock()
	for _, f := range d {
		f(nil)
	}
}

// A route never holds more than max_in_flight messages: a full route stops
// intake until its senders accept, and then everything flows.
func TestInFlightBound(t *testing.T) {
	src := startBroker(t)
	ctx := context.Background()
	rel := &release{}
	route := routing.NewRoute(routing.RouteConfig{ID: "r", Filters: []string{"b/#"}, MaxInFlight: 5, Targets: []routing.Target{{ID: "rel", Sender: rel}}})
	defer route.Close()
	_, stop := runSession(t, ctx, src.URL, "bridge-bound", "b/#", &routing.Dispatcher{Routes: []*routing.Route{route}})
	defer stop()
	publish(t, src.URL, 20, func(int) string { return "b/x" })
	testwait.Until(t, "five held", waitLimit, func() bool { return rel.held() == 5 })
	time.Sleep(100 * time.Millisecond) // room for a sixth, which must not come
	if n := route.InFlight(); n != 5 || rel.held() != 5 {
		t.Fatalf("in flight %d, held %d; want 5", n, rel.held())
	}
	delivered := 0
	testwait.Until(t, "all 20", waitLimit, func() bool {
		delivered += rel.held()
		rel.releaseAll()
		return delivered == 20
	})
	testwait.Until(t, "idle", waitLimit, func() bool { return route.InFlight() == 0 })
}
