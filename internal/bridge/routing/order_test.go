package routing_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	httpsender "github.com/myriarch/myriarch/internal/bridge/sender/http"
	"github.com/myriarch/myriarch/internal/bridge/transport"
	"github.com/myriarch/myriarch/internal/testwait"
)

// orderSink is an HTTP destination that refuses chosen requests and
// records, per topic, the payloads it accepted in arrival order.
type orderSink struct {
	mu       sync.Mutex
	accepted map[string][]int
	requests int
	// fail decides, under mu, whether to refuse a request (500).
	fail func(topic string, seq, request int) bool
	srv  *httptest.Server
}

func newOrderSink(t *testing.T, fail func(topic string, seq, request int) bool) *orderSink {
	s := &orderSink{accepted: map[string][]int{}, fail: fail}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seq, err := strconv.Atoi(string(b))
		if err != nil {
			http.Error(w, "bad payload", http.StatusBadRequest)
			return
		}
		topic := r.Header.Get("X-Myriarch-Topic")
		s.mu.Lock()
		defer s.mu.Unlock()
		s.requests++
		if s.fail(topic, seq, s.requests) {
			http.Error(w, "injected", http.StatusInternalServerError)
			return
		}
		s.accepted[topic] = append(s.accepted[topic], seq)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *orderSink) count(topic string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.accepted[topic])
}

// A sender's failures are retried without reordering a topic: a real HTTP
// destination that refuses one message of a topic several times, and
// every 7th request besides, receives every message of every topic once
// and in publish order; nothing is lost or dead-lettered.
func TestTopicOrderAcrossRetries(t *testing.T) {
	const n = 60
	topics := []string{"in/a", "in/b", "in/c"}
	src := startBroker(t)
	ctx := context.Background()
	refusedA := 0
	sk := newOrderSink(t, func(topic string, seq, request int) bool {
		if topic == "out/a" && seq == 10 && refusedA < 4 {
			refusedA++
			return true
		}
		return request%7 == 0
	})
	dir := t.TempDir()
	dl := routing.OpenDeadLetter(filepath.Join(dir, "dl.jsonl"))
	defer dl.Close()
	hs := httpsender.New(httpsender.Config{URL: sk.srv.URL, Timeout: 5 * time.Second})
	defer hs.Close(ctx)
	route := routing.NewRoute(routing.RouteConfig{ID: "r", Filters: []string{"in/#"}, MaxInFlight: 100,
		StripPrefix: "in/", AddPrefix: "out/", DeadLetter: dl,
		Targets: []routing.Target{{ID: "http", Sender: hs, MaxAttempts: 10, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}}})
	defer route.Close()
	_, stop := runSession(t, ctx, src.URL, "bridge-order", "in/#", &routing.Dispatcher{Session: "s", Routes: []*routing.Route{route}})
	defer stop()

	// Interleave the topics; the payload is the message's number within its topic.
	publishSeq(t, src.URL, n, topics)
	testwait.Until(t, "every message accepted", waitLimit, func() bool {
		for _, tp := range topics {
			if sk.count(strings.Replace(tp, "in/", "out/", 1)) < n {
				return false
			}
		}
		return true
	})
	testwait.Until(t, "route idle", waitLimit, func() bool { return route.InFlight() == 0 })
	sk.mu.Lock()
	defer sk.mu.Unlock()
	for _, tp := range topics {
		got := sk.accepted[strings.Replace(tp, "in/", "out/", 1)]
		if len(got) != n {
			t.Fatalf("%s: %d accepted, want %d: %v", tp, len(got), n, got)
		}
		for i, seq := range got {
			if seq != i {
				t.Fatalf("%s: accepted #%d is message %d (order or loss): %v", tp, i, seq, got)
			}
		}
	}
	if refusedA != 4 {
		t.Fatalf("message a/10 was refused %d times, want 4", refusedA)
	}
	if lines := readLinesMaybe(filepath.Join(dir, "dl.jsonl")); len(lines) != 0 {
		t.Fatalf("dead-lettered: %v", lines)
	}
}

// publishSeq publishes n messages on each topic, interleaved, numbering
// each topic's messages from 0.
func publishSeq(t *testing.T, url string, n int, topics []string) {
	t.Helper()
	ctx := context.Background()
	pub, err := embroker.Connect(ctx, url, fmt.Sprintf("pub-%d", time.Now().UnixNano()), true, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for i := range n {
		for _, tp := range topics {
			if _, err := pub.Publish(ctx, &paho.Publish{Topic: tp, QoS: 1, Payload: fmt.Appendf(nil, "%d", i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// Head-of-line blocking is per topic: while one topic's message keeps
// failing, the other topics are delivered; once it is accepted, its
// topic follows in order.
func TestBlockedTopicDoesNotStopOthers(t *testing.T) {
	const n = 20
	src := startBroker(t)
	ctx := context.Background()
	var release atomic.Bool
	sk := newOrderSink(t, func(topic string, seq, _ int) bool { return topic == "x/stuck" && seq == 3 && !release.Load() })
	hs := httpsender.New(httpsender.Config{URL: sk.srv.URL, Timeout: 5 * time.Second})
	defer hs.Close(ctx)
	route := routing.NewRoute(routing.RouteConfig{ID: "r", Filters: []string{"x/#"}, MaxInFlight: 100,
		Targets: []routing.Target{{ID: "http", Sender: hs, MaxAttempts: 1 << 20, InitialBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond}}})
	defer route.Close()
	_, stop := runSession(t, ctx, src.URL, "bridge-hol", "x/#", &routing.Dispatcher{Session: "s", Routes: []*routing.Route{route}})
	defer stop()
	publishSeq(t, src.URL, n, []string{"x/stuck", "x/free"})
	testwait.Until(t, "the free topic delivered", waitLimit, func() bool { return sk.count("x/free") == n })
	if got := sk.count("x/stuck"); got != 3 {
		t.Fatalf("stuck topic: %d accepted while its message 3 fails, want 3", got)
	}
	release.Store(true)
	testwait.Until(t, "the stuck topic delivered", waitLimit, func() bool { return sk.count("x/stuck") == n })
	sk.mu.Lock()
	defer sk.mu.Unlock()
	for i, seq := range sk.accepted["x/stuck"] {
		if seq != i {
			t.Fatalf("stuck topic out of order: %v", sk.accepted["x/stuck"])
		}
	}
}

// pipe is a pipelining sender under the test's control: it holds every
// message it is given until the test settles it.
type pipe struct {
	mu   sync.Mutex
	held []pipeItem
}

type pipeItem struct {
	m    *sender.Message
	done func(error)
}

func (p *pipe) Send(m *sender.Message, done func(error)) {
	p.mu.Lock()
	p.held = append(p.held, pipeItem{m, done})
	p.mu.Unlock()
}
func (p *pipe) Close(context.Context) error { return nil }

// take removes and returns what the sender holds, in the order given.
func (p *pipe) take() []pipeItem {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.held
	p.held = nil
	return h
}

func payloads(items []pipeItem) string {
	var s []string
	for _, it := range items {
		s = append(s, it.m.Topic+"="+string(it.m.Payload))
	}
	return strings.Join(s, " ")
}

// With a pipelining sender: a failure withdraws the topic's later messages
// still at the sender, holds new ones back, retries the failed one alone,
// and then sends the rest in order; another topic is not held back.
func TestFailureWithdrawsAndHoldsTheTopic(t *testing.T) {
	p := &pipe{}
	route := routing.NewRoute(routing.RouteConfig{ID: "r", Filters: []string{"#"}, MaxInFlight: 100,
		Targets: []routing.Target{{ID: "p", Sender: p, MaxAttempts: 5, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}}})
	defer route.Close()
	var acked atomic.Int32
	d := &routing.Dispatcher{Routes: []*routing.Route{route}}
	in := func(topic, payload string) {
		d.Handle(&transport.Message{Topic: topic, Payload: []byte(payload), QoS: 1}, func() { acked.Add(1) })
	}
	in("a", "1")
	in("a", "2")
	in("a", "3")
	first := p.take()
	if got := payloads(first); got != "a=1 a=2 a=3" {
		t.Fatalf("pipelined: %s", got)
	}
	first[0].done(fmt.Errorf("refused"))
	if !first[1].m.Withdrawn() || !first[2].m.Withdrawn() {
		t.Fatal("the later messages of the topic at the sender were not withdrawn")
	}
	in("a", "4")
	in("b", "1")
	if got := payloads(p.take()); got != "b=1" {
		t.Fatalf("while a is blocked, sent %q; want only b=1", got)
	}
	// The sender reports a withdrawn message unattempted, and one that it
	// had already started as delivered.
	first[1].done(sender.ErrWithdrawn)
	first[2].done(nil)
	var retry []pipeItem
	testwait.Until(t, "the retry of a=1", waitLimit, func() bool { retry = append(retry, p.take()...); return len(retry) > 0 })
	if got := payloads(retry); got != "a=1" {
		t.Fatalf("retry: %s; want a=1 alone", got)
	}
	if retry[0].m.Withdrawn() {
		t.Fatal("the retried message is still withdrawn")
	}
	retry[0].done(nil)
	rest := p.take()
	if got := payloads(rest); got != "a=2 a=4" {
		t.Fatalf("after the retry: %s; want a=2 a=4", got)
	}
	for _, it := range rest {
		if it.m.Withdrawn() {
			t.Fatalf("%s still withdrawn", it.m.Payload)
		}
		it.done(nil)
	}
	testwait.Until(t, "acks", waitLimit, func() bool { return acked.Load() == 4 })
	if route.InFlight() != 1 { // b=1 is still at the sender
		t.Fatalf("in flight %d", route.InFlight())
	}
}

// refuser refuses payload "bad" for good and accepts the rest, recording
// what it accepted.
type refuser struct {
	mu       sync.Mutex
	calls    int
	accepted []string
}

func (f *refuser) Send(m *sender.Message, done func(error)) {
	f.mu.Lock()
	f.calls++
	if string(m.Payload) == "bad" {
		f.mu.Unlock()
		done(sender.Permanent(fmt.Errorf("refused for good")))
		return
	}
	f.accepted = append(f.accepted, string(m.Payload))
	f.mu.Unlock()
	done(nil)
}
func (f *refuser) Close(context.Context) error { return nil }

// A permanent failure is dead-lettered at the first attempt, without the
// backoff schedule, and its topic goes on in order.
func TestPermanentFailureDeadLettersAtOnce(t *testing.T) {
	dlPath := filepath.Join(t.TempDir(), "dl.jsonl")
	dl := routing.OpenDeadLetter(dlPath)
	defer dl.Close()
	f := &refuser{}
	route := routing.NewRoute(routing.RouteConfig{ID: "r", Filters: []string{"#"}, DeadLetter: dl,
		Targets: []routing.Target{{ID: "f", Sender: f, MaxAttempts: 5, InitialBackoff: time.Hour, MaxBackoff: time.Hour}}})
	defer route.Close()
	var acked atomic.Int32
	d := &routing.Dispatcher{Routes: []*routing.Route{route}}
	for _, p := range []string{"1", "bad", "2", "3"} {
		d.Handle(&transport.Message{Topic: "t", Payload: []byte(p), QoS: 1}, func() { acked.Add(1) })
	}
	testwait.Until(t, "all settled", waitLimit, func() bool { return acked.Load() == 4 })
	f.mu.Lock()
	defer f.mu.Unlock()
	if got := fmt.Sprint(f.accepted); got != "[1 2 3]" || f.calls != 4 {
		t.Fatalf("accepted %s in %d calls", got, f.calls)
	}
	lines := readLinesMaybe(dlPath)
	if len(lines) != 1 || !strings.Contains(lines[0], `"attempts":1`) || !strings.Contains(lines[0], `permanent failure after 1 attempts: refused for good`) {
		t.Fatalf("dead letters: %v", lines)
	}
}

// Two routes share one HTTP sender and deliver the same topic: when one
// route's message fails, the sender skips the topic's later messages in
// its batch, the other route's included; both routes keep their order and
// lose nothing.
func TestSharedSenderKeepsEachRoutesOrder(t *testing.T) {
	const n = 40
	var mu sync.Mutex
	got := map[string][]int{}
	refused := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seq, _ := strconv.Atoi(string(b))
		route := r.Header.Get("X-Myriarch-Route")
		mu.Lock()
		defer mu.Unlock()
		if route == "r1" && seq == 5 && refused < 3 {
			refused++
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		got[route] = append(got[route], seq)
	}))
	defer srv.Close()
	hs := httpsender.New(httpsender.Config{URL: srv.URL, Timeout: 5 * time.Second})
	defer hs.Close(context.Background())
	var routes []*routing.Route
	for _, id := range []string{"r1", "r2"} {
		r := routing.NewRoute(routing.RouteConfig{ID: id, Filters: []string{"#"}, MaxInFlight: 2 * n,
			Targets: []routing.Target{{ID: "http", Sender: hs, MaxAttempts: 10, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}}})
		defer r.Close()
		routes = append(routes, r)
	}
	var acked atomic.Int32
	d := &routing.Dispatcher{Routes: routes}
	for i := range n {
		d.Handle(&transport.Message{Topic: "t", Payload: fmt.Append(nil, i), QoS: 1}, func() { acked.Add(1) })
	}
	testwait.Until(t, "every message acknowledged", waitLimit, func() bool { return acked.Load() == n })
	mu.Lock()
	defer mu.Unlock()
	for _, id := range []string{"r1", "r2"} {
		if len(got[id]) != n {
			t.Fatalf("%s: %d delivered: %v", id, len(got[id]), got[id])
		}
		for i, seq := range got[id] {
			if seq != i {
				t.Fatalf("%s out of order: %v", id, got[id])
			}
		}
	}
	if refused != 3 {
		t.Fatalf("refused %d times", refused)
	}
}
