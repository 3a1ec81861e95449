package mqtt_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/transport"
	"github.com/myriarch/myriarch/internal/bridge/transport/mqtt"
	"github.com/myriarch/myriarch/internal/testnet"
	"github.com/myriarch/myriarch/internal/testwait"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/mochi-mqtt/server/v2.(*Server).eventLoop"))
}

// waitLimit bounds the waits of this package's tests (testwait.Until).
const waitLimit = 20 * time.Second

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		filter, topic string
		want          bool
	}{
		{"a/b", "a/b", true}, {"a/+", "a/b", true}, {"a/+", "a/b/c", false}, {"a/#", "a/b/c", true},
		{"a/#", "a", true}, {"#", "a/b", true}, {"#", "$SYS/x", false}, {"+/b", "$SYS/b", false},
		{"$share/g/a/+", "a/x", true}, {"a/b", "a/c", false}, {"a/+/c", "a//c", true}, {"a", "a/b", false},
	} {
		if got := transport.Match(c.filter, c.topic); got != c.want {
			t.Errorf("Match(%q, %q) = %v", c.filter, c.topic, got)
		}
	}
}

func TestActivationBound(t *testing.T) {
	act, err := transport.Config{ConnectTimeout: 30 * time.Second, ReconcileTimeout: 30 * time.Second, UnmatchedGrace: 30 * time.Second}.Activation()
	if err != nil || act.Bound != 240*time.Second {
		t.Fatalf("bound %v, %v", act.Bound, err)
	}
}

// A broker that accepts TCP and never answers CONNECT: every attempt must
// end by connect_timeout, so the session keeps trying instead of hanging.
func TestConnectTimeoutEndsEachAttempt(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	var conns []net.Conn
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	s, err := mqtt.New(transport.Config{Brokers: []string{"tcp://" + l.Addr().String()}, ClientID: "x",
		ConnectTimeout: 100 * time.Millisecond, ReconcileTimeout: time.Second, UnmatchedGrace: time.Second,
		Handler: func(*transport.Message, func()) {}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = s.Run(ctx) }()
	testwait.Until(t, "three bounded attempts", waitLimit, func() bool { return accepted.Load() >= 3 })
	if s.Level() != transport.LevelNone {
		t.Fatalf("level %v without a CONNACK", s.Level())
	}
	cancel()
	<-ran
	_ = l.Close()
	<-done
	mu.Lock()
	for _, c := range conns {
		_ = c.Close()
	}
	mu.Unlock()
}

// Levels go degraded → full on activation, none when the broker goes away,
// and full again when it is back.
func TestServiceLevelFollowsBrokerPath(t *testing.T) {
	b, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	// The client dials a relay bound by the test; the restarted broker
	// gets a fresh port behind it.
	r := testnet.NewRelay(t, b.Addr)
	var mu sync.Mutex
	var levels []transport.Level
	s, err := mqtt.New(transport.Config{Brokers: []string{"tcp://" + r.Addr()}, ClientID: "lv", SessionExpiry: time.Hour, KeepAlive: 5 * time.Second,
		ConnectTimeout: time.Second, ReconcileTimeout: time.Second, UnmatchedGrace: time.Second,
		Subscriptions: []transport.Subscription{{Filter: "a/#", QoS: 1}},
		Handler:       func(_ *transport.Message, ack func()) { ack() },
		OnLevel: func(l transport.Level) {
			mu.Lock()
			levels = append(levels, l)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = s.Run(ctx) }()
	testwait.Until(t, "full", waitLimit, func() bool { return s.Level() == transport.LevelFull })
	r.SetTarget("")
	_ = b.Close()
	testwait.Until(t, "none", waitLimit, func() bool { return s.Level() == transport.LevelNone })
	b2, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	r.SetTarget(b2.Addr)
	testwait.Until(t, "full again", waitLimit, func() bool { return s.Level() == transport.LevelFull })
	cancel()
	<-ran
	mu.Lock()
	defer mu.Unlock()
	want := []transport.Level{transport.LevelDegraded, transport.LevelFull, transport.LevelNone, transport.LevelDegraded, transport.LevelFull, transport.LevelNone}
	if len(levels) != len(want) {
		t.Fatalf("levels %v, want %v", levels, want)
	}
	for i := range want {
		if levels[i] != want[i] {
			t.Fatalf("levels %v, want %v", levels, want)
		}
	}
}

// A resumed session drops the filters the configuration no longer has:
// the next owner unsubscribes what the state file says was subscribed.
func TestReconcileUnsubscribesRemovedFilters(t *testing.T) {
	b, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	state := filepath.Join(t.TempDir(), "subs.json")
	var got sync.Map
	run := func(filters ...string) func() {
		var subs []transport.Subscription
		for _, f := range filters {
			subs = append(subs, transport.Subscription{Filter: f, QoS: 1})
		}
		s, err := mqtt.New(transport.Config{Brokers: []string{b.URL}, ClientID: "rc", SessionExpiry: time.Hour, KeepAlive: 5 * time.Second,
			ConnectTimeout: time.Second, ReconcileTimeout: time.Second, UnmatchedGrace: time.Second, StateFile: state,
			Subscriptions: subs, Handler: func(m *transport.Message, ack func()) { got.Store(m.Topic, true); ack() }})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan struct{})
		go func() { defer close(ran); _ = s.Run(ctx) }()
		testwait.Until(t, "full", waitLimit, func() bool { return s.Level() == transport.LevelFull })
		return func() { cancel(); <-ran }
	}
	stop := run("a/#", "b/#")
	stop()
	stop = run("a/#")
	defer stop()
	pub, err := embroker.Connect(context.Background(), b.URL, "rc-pub", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for _, topic := range []string{"b/x", "a/x"} {
		if _, err := pub.Publish(context.Background(), &paho.Publish{Topic: topic, QoS: 1, Payload: []byte("1")}); err != nil {
			t.Fatal(err)
		}
	}
	testwait.Until(t, "a/x", waitLimit, func() bool { _, ok := got.Load("a/x"); return ok })
	if len(b.Server.Topics.Subscribers("b/x").Subscriptions) != 0 {
		t.Fatal("b/# is still subscribed on the broker")
	}
	data, _ := os.ReadFile(state)
	if string(data) != `{"client_id":"rc","filters":["a/#"]}` {
		t.Fatalf("state %s", data)
	}
}

type switchTenure struct{ ok atomic.Bool }

func (t *switchTenure) Valid() bool { return t.ok.Load() }

// A session whose tenure ended does not reconnect after losing its
// connection: Run returns ErrTenureEnded instead, so a deposed owner never
// takes the client_id back from its successor.
func TestEndedTenureDoesNotReconnect(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepts atomic.Int32
	var wg sync.WaitGroup
	defer wg.Wait()
	defer l.Close() // before the Wait: it ends the accept loop
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepts.Add(1)
			c.Close() // the "broker" drops every connection at once
		}
	}()
	ten := &switchTenure{}
	ten.ok.Store(true)
	s, err := mqtt.New(transport.Config{Brokers: []string{"tcp://" + l.Addr().String()}, ClientID: "c", ConnectTimeout: time.Second,
		ReconcileTimeout: time.Second, UnmatchedGrace: time.Second, Handler: func(*transport.Message, func()) {}, Tenure: ten})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- s.Run(ctx) }()
	testwait.Until(t, "a connection attempt", waitLimit, func() bool { return accepts.Load() > 0 })
	ten.ok.Store(false)
	select {
	case err := <-done:
		if !errors.Is(err, transport.ErrTenureEnded) {
			t.Fatalf("Run = %v, want transport.ErrTenureEnded", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run kept reconnecting after its tenure ended")
	}
	n := accepts.Load()
	time.Sleep(500 * time.Millisecond) // longer than the reconnect backoffs so far
	if accepts.Load() != n {
		t.Fatal("connection attempts after Run returned")
	}
}
