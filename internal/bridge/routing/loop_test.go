package routing_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/myriarch/myriarch/internal/bridge/metrics"
	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	mqttsender "github.com/myriarch/myriarch/internal/bridge/sender/mqtt"
	"github.com/myriarch/myriarch/internal/bridge/transport"
	"github.com/myriarch/myriarch/internal/bridge/transport/mqtt"
	"github.com/myriarch/myriarch/internal/testwait"
)

// runLeg runs one direction of a bidirectional bridge until the test
// ends: a session on from subscribed to x/#, and route id delivering to an
// mqtt sender on to, topics unchanged (so that, unguarded, what one leg
// publishes is what the other leg subscribed to).
func runLeg(t *testing.T, id, peer, from, to string, met *metrics.Bridge) {
	t.Helper()
	out := mqttsender.New(mqttsender.Config{Broker: to, ClientID: fmt.Sprintf("%s-out-%d", id, time.Now().UnixNano()), QoS: 1, KeepAlive: 30 * time.Second})
	route := routing.NewRoute(routing.RouteConfig{ID: id, Filters: []string{"x/#"}, LoopPeer: peer, Metrics: met,
		Targets: []routing.Target{{ID: "to", Sender: out, MaxAttempts: 3}}})
	d := &routing.Dispatcher{Session: id, Routes: []*routing.Route{route}, Metrics: met}
	s, err := mqtt.New(transport.Config{Brokers: []string{from}, ClientID: fmt.Sprintf("%s-in-%d", id, time.Now().UnixNano()), CleanStart: true, KeepAlive: 30 * time.Second,
		ConnectTimeout: 10 * time.Second, ReconcileTimeout: 10 * time.Second, UnmatchedGrace: time.Second, ReceiveMaximum: 1000,
		Subscriptions: []transport.Subscription{{Filter: "x/#", QoS: 1}}, Handler: d.Handle})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		route.Close()
		_ = out.Close(context.Background())
	})
	testwait.Until(t, id+"'s session at full service", waitLimit, func() bool { return s.Level() == transport.LevelFull })
}

// quietCounts waits until every subscriber received at least want
// messages and then until none receives another for quiet, and returns
// what they received. It fails when messages keep arriving: a loop.
func quietCounts(t *testing.T, want int, quiet time.Duration, subs ...func() []*paho.Publish) [][]*paho.Publish {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	counts := func() []int {
		c := make([]int, len(subs))
		for i, s := range subs {
			c[i] = len(s())
		}
		return c
	}
	last, since := counts(), time.Now()
	for {
		time.Sleep(20 * time.Millisecond)
		cur := counts()
		if fmt.Sprint(cur) != fmt.Sprint(last) {
			last, since = cur, time.Now()
		}
		enough := true
		for _, c := range cur {
			enough = enough && c >= want
		}
		if enough && time.Since(since) >= quiet {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("subscribers at %v after 30s, want %d each and then %v without a message", cur, want, quiet)
		}
	}
	out := make([][]*paho.Publish, len(subs))
	for i, s := range subs {
		out[i] = s()
	}
	return out
}

// hop is the value of a message's hop stamp ("" none).
func hop(p *paho.Publish) string {
	if p.Properties == nil {
		return ""
	}
	return p.Properties.User.Get(routing.HopProperty)
}

// TestBidirectionalNoEcho: two routes in opposite directions between
// brokers A and B over the same topics, named as each other's loop peer.
// N messages published on each broker reach the other broker exactly once,
// nothing comes back, and the brokers stay quiet afterwards: each side's
// subscriber sees its own N and the other side's N, once each.
func TestBidirectionalNoEcho(t *testing.T) {
	const n = 200
	for _, kind := range []string{"embedded", "mosquitto"} {
		t.Run(kind, func(t *testing.T) {
			a, b := brokerPair(t, kind)
			onA, onB := collect(t, a, "x/#"), collect(t, b, "x/#")
			met := metrics.New(nil)
			runLeg(t, "a-to-b", "b-to-a", a, b, met)
			runLeg(t, "b-to-a", "a-to-b", b, a, met)
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); publish(t, a, n, func(int) string { return "x/from-a" }) }()
			go func() { defer wg.Done(); publish(t, b, n, func(int) string { return "x/from-b" }) }()
			wg.Wait()
			got := quietCounts(t, 2*n, 2*time.Second, onA, onB)
			for side, msgs := range got {
				name := []string{"A", "B"}[side]
				seen := map[string]int{}
				for _, p := range msgs {
					key := fmt.Sprintf("%s %s", p.Topic, p.Payload)
					seen[key]++
					if seen[key] > 1 {
						t.Errorf("broker %s: %q received %d times", name, key, seen[key])
					}
					// What the bridge published carries the stamp of
					// the route that published it; local messages none.
					wantHop := ""
					if side == 0 && p.Topic == "x/from-b" {
						wantHop = "b-to-a"
					} else if side == 1 && p.Topic == "x/from-a" {
						wantHop = "a-to-b"
					}
					if h := hop(p); h != wantHop {
						t.Errorf("broker %s: %q has hop stamp %q, want %q", name, key, h, wantHop)
					}
				}
				if len(msgs) != 2*n || len(seen) != 2*n {
					t.Errorf("broker %s: %d messages, %d distinct, want %d of each", name, len(msgs), len(seen), 2*n)
				}
			}
			for _, r := range []string{"a-to-b", "b-to-a"} {
				if in, dropped := testutil.ToFloat64(met.In.WithLabelValues(r)), testutil.ToFloat64(met.LoopDropped.WithLabelValues(r)); in != n || dropped != n {
					t.Errorf("route %s took %v and dropped %v as its peer's, want %d of each", r, in, dropped, n)
				}
			}
			if u := testutil.CollectAndCount(met.Unroutable); u != 0 {
				t.Errorf("%d unroutable series: a message the peer published must count as loop-dropped, not unroutable", u)
			}
		})
	}
}

// TestBidirectionalUnguardedEchoes is the control for the test above: the
// same pair without loop_peer sends a message round and round, which is
// what the guard prevents (and what the test above would see).
func TestBidirectionalUnguardedEchoes(t *testing.T) {
	a, b := brokerPair(t, "embedded")
	onA := collect(t, a, "x/#")
	runLeg(t, "a-to-b", "", a, b, nil)
	runLeg(t, "b-to-a", "", b, a, nil)
	publish(t, a, 1, func(int) string { return "x/from-a" })
	testwait.Until(t, "the message back on A twice", waitLimit, func() bool { return len(onA()) >= 3 })
}

// capture is a sender that keeps what it is given.
type capture struct {
	mu  sync.Mutex
	got []*sender.Message
}

func (c *capture) Send(m *sender.Message, done func(error)) {
	c.mu.Lock()
	c.got = append(c.got, m)
	c.mu.Unlock()
	done(nil)
}
func (c *capture) Close(context.Context) error { return nil }

// TestLoopPeerChains: a route of a loop pair drops only what its peer
// published. A route chained after the pair's leg (it bridges on from the
// leg's destination) takes what the leg published, and a leg that
// publishes replaces the hop stamp the message arrived with and keeps the
// other user properties in order.
func TestLoopPeerChains(t *testing.T) {
	met := metrics.New(nil)
	back, chain := &capture{}, &capture{}
	backRoute := routing.NewRoute(routing.RouteConfig{ID: "b-to-a", Filters: []string{"#"}, LoopPeer: "a-to-b", Metrics: met,
		Targets: []routing.Target{{ID: "a", Sender: back}}})
	chainRoute := routing.NewRoute(routing.RouteConfig{ID: "b-to-c", Filters: []string{"#"}, Metrics: met,
		Targets: []routing.Target{{ID: "c", Sender: chain}}})
	defer backRoute.Close()
	defer chainRoute.Close()
	d := &routing.Dispatcher{Session: "b", Routes: []*routing.Route{backRoute, chainRoute}, Metrics: met}
	var acks atomic.Int32
	props := func(users ...sender.UserProperty) *sender.Properties { return &sender.Properties{User: users} }
	// Published on B by a-to-b: only the chained route takes it.
	d.Handle(&transport.Message{Topic: "t/1", Properties: props(sender.UserProperty{Key: routing.HopProperty, Value: "a-to-b"})}, func() { acks.Add(1) })
	// Published on B by another pair's leg (c-to-b), with other user
	// properties: both take it; b-to-a stamps itself instead.
	d.Handle(&transport.Message{Topic: "t/2", Properties: props(sender.UserProperty{Key: "k", Value: "1"},
		sender.UserProperty{Key: routing.HopProperty, Value: "c-to-b"}, sender.UserProperty{Key: "k", Value: "2"})}, func() { acks.Add(1) })
	// A local message without properties.
	d.Handle(&transport.Message{Topic: "t/3"}, func() { acks.Add(1) })
	testwait.Until(t, "every message settled", waitLimit, func() bool { return acks.Load() == 3 })
	if len(chain.got) != 3 {
		t.Fatalf("chained route took %d messages, want 3", len(chain.got))
	}
	if h := chain.got[0].Properties.User; len(h) != 1 || h[0].Value != "a-to-b" {
		t.Errorf("chained route changed the stamp: %v", h)
	}
	if len(back.got) != 2 || back.got[0].Topic != "t/2" || back.got[1].Topic != "t/3" {
		t.Fatalf("b-to-a took %v, want t/2 and t/3", back.got)
	}
	want := []sender.UserProperty{{Key: "k", Value: "1"}, {Key: "k", Value: "2"}, {Key: routing.HopProperty, Value: "b-to-a"}}
	if fmt.Sprint(back.got[0].Properties.User) != fmt.Sprint(want) {
		t.Errorf("b-to-a published user properties %v, want %v", back.got[0].Properties.User, want)
	}
	if fmt.Sprint(back.got[1].Properties.User) != fmt.Sprint(want[2:]) {
		t.Errorf("b-to-a published user properties %v, want %v", back.got[1].Properties.User, want[2:])
	}
	if dropped := testutil.ToFloat64(met.LoopDropped.WithLabelValues("b-to-a")); dropped != 1 {
		t.Errorf("loop-dropped %v, want 1", dropped)
	}
}
