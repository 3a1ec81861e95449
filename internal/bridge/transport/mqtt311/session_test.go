package mqtt311

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/transport"
	"github.com/myriarch/myriarch/internal/faultnet"
	"github.com/myriarch/myriarch/internal/testwait"
)

// fakeMessage records its acknowledgment.
type fakeMessage struct {
	id   uint16
	sent *[]uint16
	mu   *sync.Mutex
}

func (f fakeMessage) Duplicate() bool   { return false }
func (f fakeMessage) Qos() byte         { return 1 }
func (f fakeMessage) Retained() bool    { return false }
func (f fakeMessage) Topic() string     { return "t" }
func (f fakeMessage) MessageID() uint16 { return f.id }
func (f fakeMessage) Payload() []byte   { return nil }
func (f fakeMessage) Ack() {
	f.mu.Lock()
	*f.sent = append(*f.sent, f.id)
	f.mu.Unlock()
}

// Acknowledgments released out of order leave in arrival order, a
// released one waiting for the earlier ones; once the tenure ended none
// leaves.
func TestAckerSendsInArrivalOrder(t *testing.T) {
	var mu sync.Mutex
	var sent []uint16
	valid := atomic.Bool{}
	valid.Store(true)
	a := &acker{valid: valid.Load}
	var rel []func()
	for id := uint16(1); id <= 6; id++ {
		rel = append(rel, a.add(fakeMessage{id, &sent, &mu}))
	}
	got := func() string { mu.Lock(); defer mu.Unlock(); return fmt.Sprint(sent) }
	rel[2]()
	rel[1]()
	if got() != "[]" {
		t.Fatalf("sent %s before message 1 was released", got())
	}
	rel[0]()
	if got() != "[1 2 3]" {
		t.Fatalf("sent %s, want [1 2 3]", got())
	}
	rel[0]() // twice: no second PUBACK
	rel[3]()
	valid.Store(false)
	rel[5]()
	rel[4]()
	if got() != "[1 2 3 4]" {
		t.Fatalf("sent %s, want [1 2 3 4]: nothing after the tenure ended", got())
	}
}

type flagTenure struct{ ok atomic.Bool }

func (f *flagTenure) Valid() bool { return f.ok.Load() }

// record is a handler that keeps every message and acknowledges them in
// reversed pairs (2 before 1, 4 before 3, ...), so that the session's
// ordering of acknowledgments is exercised.
type record struct {
	mu    sync.Mutex
	msgs  []*transport.Message
	prev  func()
	acked atomic.Int64 // acknowledgments handed to the session
}

func (r *record) handle(m *transport.Message, ack func()) {
	r.mu.Lock()
	r.msgs = append(r.msgs, m)
	prev := r.prev
	if prev == nil {
		r.prev = ack
		r.mu.Unlock()
		return
	}
	r.prev = nil
	r.mu.Unlock()
	ack()
	prev()
	r.acked.Add(2)
}

func (r *record) payloads() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.msgs))
	for i, m := range r.msgs {
		out[i] = m.Topic + ":" + string(m.Payload)
	}
	return out
}

func testConfig(url, clientID string, h transport.Handler) transport.Config {
	return transport.Config{Brokers: []string{url}, ClientID: clientID, KeepAlive: 5 * time.Second,
		ConnectTimeout: 5 * time.Second, ReconcileTimeout: 5 * time.Second, UnmatchedGrace: time.Second,
		Subscriptions: []transport.Subscription{{Filter: "t/#", QoS: 1}}, Handler: h}
}

func start(t *testing.T, cfg transport.Config) (*Session, func() error) {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-ran
	}
	t.Cleanup(func() { _ = stop() })
	return s, stop
}

// An exclusive session's broker session survives the bridge: with a fixed
// client_id and CleanSession false, what was published while no bridge was
// connected arrives, in order, when the next one connects, which sees
// SessionPresent.
func TestResumedSession(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		rec := &record{}
		cfg := testConfig(b.url, "plant-bridge", rec.handle)
		s, stop := start(t, cfg)
		testwait.Until(t, "full", waitLimit, func() bool { return s.Level() == transport.LevelFull })
		if s.SessionPresent() {
			t.Fatal("a new broker session reported as present")
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		p := publisher(t, b.url)
		for i := range 20 {
			publish(t, p, "t/a", 1, strconv.Itoa(i))
		}
		rec2 := &record{}
		cfg.Handler = rec2.handle
		s2, _ := start(t, cfg)
		testwait.Until(t, "20 queued messages", waitLimit, func() bool { return len(rec2.payloads()) >= 20 })
		if !s2.SessionPresent() {
			t.Fatal("the resumed broker session not reported as present")
		}
		if distinct(rec2.payloads()) != 20 {
			t.Fatalf("want the 20 queued messages, got %v", rec2.payloads())
		}
		if b.ordersResends {
			for i, got := range rec2.payloads()[:20] {
				if want := "t/a:" + strconv.Itoa(i); got != want {
					t.Fatalf("message %d: %s, want %s (all: %v)", i, got, want, rec2.payloads())
				}
			}
		}
		if n := len(rec.payloads()); n != 0 {
			t.Fatalf("the first connection received %d messages", n)
		}
	})
}

// Cutting the connection mid-stream loses nothing: what was not
// acknowledged is redelivered on the resumed session, and per topic the
// first arrivals keep the publish order (on a broker that resends in
// order).
func TestAtLeastOnceAcrossACutConnection(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		cut, err := faultnet.Listen(faultnet.Options{}, b.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer cut.Close()
		rec := &record{}
		cfg := testConfig("tcp://"+cut.Addr(), "alo-bridge", rec.handle)
		s, _ := start(t, cfg)
		testwait.Until(t, "full", waitLimit, func() bool { return s.Level() == transport.LevelFull })
		p := publisher(t, b.url)
		const n = 300
		for i := range n {
			publish(t, p, "t/"+[]string{"a", "b"}[i%2], 1, strconv.Itoa(i))
			if i == n/3 || i == 2*n/3 {
				cut.Cut()
			}
		}
		testwait.Until(t, "every message", waitLimit, func() bool { return distinct(rec.payloads()) == n })
		if b.ordersResends {
			checkFirstArrivalsInOrder(t, rec.payloads())
		}
	})
}

func distinct(ps []string) int {
	seen := map[string]bool{}
	for _, p := range ps {
		seen[p] = true
	}
	return len(seen)
}

// checkFirstArrivalsInOrder fails unless, per topic, the first arrival of
// each payload (an integer) comes in increasing order.
func checkFirstArrivalsInOrder(t *testing.T, ps []string) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int{}
	for _, p := range ps {
		if seen[p] {
			continue
		}
		seen[p] = true
		topic, v, _ := strings.Cut(p, ":")
		n, _ := strconv.Atoi(v)
		if l, ok := last[topic]; ok && n < l {
			t.Fatalf("topic %s: %d arrived first after %d", topic, n, l)
		}
		last[topic] = n
	}
}

// connects counts the sessions the embedded broker establishes per
// client_id.
type connects struct {
	mochi.HookBase
	mu sync.Mutex
	n  map[string]int
}

func (c *connects) ID() string           { return "connects" }
func (c *connects) Provides(b byte) bool { return b == mochi.OnSessionEstablished }
func (c *connects) count(id string) int  { c.mu.Lock(); defer c.mu.Unlock(); return c.n[id] }
func (c *connects) OnSessionEstablished(cl *mochi.Client, _ packets.Packet) {
	c.mu.Lock()
	c.n[cl.ID]++
	c.mu.Unlock()
}

// Once the tenure ended the session acts no more: it hands nothing on,
// and when the broker drops it, it does not reconnect with the shared
// client_id (which would take the session from a successor); Run returns
// ErrTenureEnded.
func TestTenureEndedNoReconnectNoDelivery(t *testing.T) {
	b, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	watch := &connects{n: map[string]int{}}
	if err := b.Server.AddHook(watch, nil); err != nil {
		t.Fatal(err)
	}
	ten := &flagTenure{}
	ten.ok.Store(true)
	rec := &record{}
	cfg := testConfig(b.URL, "tenured", rec.handle)
	cfg.Tenure = ten
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { ran <- s.Run(ctx) }()
	testwait.Until(t, "full", waitLimit, func() bool { return s.Level() == transport.LevelFull })
	p := publisher(t, b.URL)
	for i := range 4 {
		publish(t, p, "t/a", 1, strconv.Itoa(i))
	}
	testwait.Until(t, "4 delivered", waitLimit, func() bool { return len(rec.payloads()) == 4 })

	ten.ok.Store(false)
	for i := 4; i < 8; i++ {
		publish(t, p, "t/a", 1, strconv.Itoa(i))
	}
	cl, ok := b.Server.Clients.Get("tenured")
	if !ok {
		t.Fatal("the session's client is not connected")
	}
	before := watch.count("tenured")
	cl.Stop(errors.New("test: connection dropped"))
	select {
	case err := <-ran:
		if !errors.Is(err, ErrTenureEnded) {
			t.Fatalf("Run returned %v, want ErrTenureEnded", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after the tenure ended and the connection dropped")
	}
	// Well above the reconnect backoff (100ms): a live session would have
	// reconnected by now.
	time.Sleep(time.Second)
	if n := watch.count("tenured") - before; n > 0 {
		t.Fatalf("reconnected %d time(s) after the tenure ended", n)
	}
	if got := rec.payloads(); len(got) != 4 {
		t.Fatalf("handed on %d messages after the tenure ended: %v", len(got)-4, got[4:])
	}
}

// The activation bound is the MQTT 5 transport's, declared through the
// same Config, and each step honours its own timeout: a broker that
// accepts TCP but never answers CONNECT (blackholed) ends the activation
// after two connect attempts, one that answers CONNECT but never SUBACK
// after one reconcile_timeout, both well within the declared bound.
func TestActivationBoundHonoured(t *testing.T) {
	cfg := testConfig("", "act", func(*transport.Message, func()) {})
	cfg.ConnectTimeout, cfg.ReconcileTimeout, cfg.UnmatchedGrace = 300*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond
	act, err := cfg.Activation()
	if err != nil || act.Bound != 2*300*time.Millisecond+4*300*time.Millisecond+2*300*time.Millisecond {
		t.Fatalf("declared bound %v, %v", act.Bound, err)
	}
	for _, c := range []struct {
		name  string
		serve func(net.Conn)
		want  string
		tries int64
	}{
		{"blackholed CONNECT", func(c net.Conn) { _, _ = c.Read(make([]byte, 1024)) }, "connect_timeout", 2},
		{"no SUBACK", func(c net.Conn) {
			_, _ = c.Read(make([]byte, 1024))
			_, _ = c.Write([]byte{0x20, 0x02, 0x00, 0x00}) // CONNACK accepted
			_, _ = c.Read(make([]byte, 1024))              // SUBSCRIBE, never answered
		}, "reconcile_timeout", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			var accepted atomic.Int64
			var wg sync.WaitGroup
			var mu sync.Mutex
			var conns []net.Conn
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					conn, err := l.Accept()
					if err != nil {
						return
					}
					accepted.Add(1)
					mu.Lock()
					conns = append(conns, conn)
					mu.Unlock()
					wg.Add(1)
					go func() { defer wg.Done(); c.serve(conn) }()
				}
			}()
			defer func() {
				_ = l.Close()
				mu.Lock()
				for _, c := range conns {
					_ = c.Close()
				}
				mu.Unlock()
				wg.Wait()
			}()
			cfg := cfg
			cfg.Brokers = []string{"tcp://" + l.Addr().String()}
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			began := time.Now()
			err = s.connection(context.Background(), 0)
			took := time.Since(began)
			if !errors.Is(err, ErrActivation) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("activation ended with %v, want an activation error naming %s", err, c.want)
			}
			if took > act.Bound {
				t.Fatalf("activation took %v, beyond the declared bound %v", took, act.Bound)
			}
			if n := accepted.Load(); n != c.tries {
				t.Fatalf("%d connect attempts, want %d", n, c.tries)
			}
			if s.Level() != transport.LevelNone && c.tries == 2 {
				t.Fatalf("level %v without a CONNACK", s.Level())
			}
			t.Logf("%s: activation ended after %v (declared bound %v)", c.name, took.Round(time.Millisecond), act.Bound)
		})
	}
}

// Retained messages on MQTT 3.1.1, as docs/bridge.md says: the retained
// message of a filter arrives with the retain flag at SUBSCRIBE, a live
// message published retained arrives without it (no Retain As Published),
// and a resumed session that subscribes again receives the retained
// message again (no Retain Handling).
func TestRetainedMessages(t *testing.T) {
	eachBroker(t, func(t *testing.T, b broker) {
		p := publisher(t, b.url)
		if tok := p.Publish("t/kept", 1, true, "stored"); !tok.WaitTimeout(20*time.Second) || tok.Error() != nil {
			t.Fatal(tok.Error())
		}
		rec := &record{}
		cfg := testConfig(b.url, "retain-bridge", rec.handle)
		s, stop := start(t, cfg)
		testwait.Until(t, "full", waitLimit, func() bool { return s.Level() == transport.LevelFull })
		testwait.Until(t, "the retained message", waitLimit, func() bool { return len(rec.payloads()) >= 1 })
		if tok := p.Publish("t/live", 1, true, "live"); !tok.WaitTimeout(20*time.Second) || tok.Error() != nil {
			t.Fatal(tok.Error())
		}
		testwait.Until(t, "the live message", waitLimit, func() bool { return len(rec.payloads()) >= 2 })
		// Stop only after both are acknowledged: an unacknowledged live
		// message is rightly sent again on resume, as a live message.
		testwait.Until(t, "both acknowledged", waitLimit, func() bool { return rec.acked.Load() >= 2 })
		rec.mu.Lock()
		first, live := *rec.msgs[0], *rec.msgs[1]
		rec.mu.Unlock()
		if first.Topic != "t/kept" || !first.Retain {
			t.Fatalf("at SUBSCRIBE: %s retain %v, want t/kept retained", first.Topic, first.Retain)
		}
		if live.Topic != "t/live" || live.Retain {
			t.Fatalf("live: %s retain %v, want t/live without the flag (3.1.1 has no Retain As Published)", live.Topic, live.Retain)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		rec2 := &record{}
		cfg.Handler = rec2.handle
		s2, _ := start(t, cfg)
		testwait.Until(t, "the retained messages again", waitLimit, func() bool { return len(rec2.payloads()) >= 2 })
		if !s2.SessionPresent() {
			t.Fatal("the session was not resumed")
		}
		rec2.mu.Lock()
		defer rec2.mu.Unlock()
		for _, m := range rec2.msgs {
			if !m.Retain {
				t.Fatalf("resumed: %s without the retain flag", m.Topic)
			}
		}
	})
}
