package routing_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	mqttsender "github.com/myriarch/myriarch/internal/bridge/sender/mqtt"
	"github.com/myriarch/myriarch/internal/bridge/transport"
	"github.com/myriarch/myriarch/internal/bridge/transport/mqtt"
	"github.com/myriarch/myriarch/internal/testwait"
)

// brokerPair starts two brokers of one kind: the embedded broker or
// mosquitto (skipped without it, except under CI=true).
func brokerPair(t *testing.T, kind string) (a, b string) {
	t.Helper()
	if kind == "mosquitto" {
		return "tcp://" + embroker.TestMosquitto(t, "").Addr, "tcp://" + embroker.TestMosquitto(t, "").Addr
	}
	urls := make([]string, 2)
	for i := range urls {
		br, err := embroker.Start("", nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = br.Close() })
		urls[i] = br.URL
	}
	return urls[0], urls[1]
}

// publishNow publishes one message through a fresh QoS 1 sender and waits
// for its PUBACK.
func publishNow(t *testing.T, url string, m *sender.Message) {
	t.Helper()
	s := mqttsender.New(mqttsender.Config{Broker: url, ClientID: fmt.Sprintf("pub-%d", time.Now().UnixNano()), QoS: 1, KeepAlive: 30 * time.Second})
	defer s.Close(context.Background())
	done := make(chan error, 1)
	s.Send(m, func(err error) { done <- err })
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no PUBACK within 30s")
	}
}

// runBridge runs a session on a ("in/#") with one route to an MQTT sender
// on b ("in/" → "out/") until the test ends.
func runBridge(t *testing.T, a, b string, rc routing.RouteConfig) {
	t.Helper()
	out := mqttsender.New(mqttsender.Config{Broker: b, ClientID: fmt.Sprintf("out-%d", time.Now().UnixNano()), QoS: 1, KeepAlive: 30 * time.Second})
	rc.ID, rc.Filters, rc.StripPrefix, rc.AddPrefix = "r", []string{"in/#"}, "in/", "out/"
	rc.Targets = []routing.Target{{ID: "b", Sender: out, MaxAttempts: 3}}
	route := routing.NewRoute(rc)
	d := &routing.Dispatcher{Session: "s", Routes: []*routing.Route{route}}
	s, err := mqtt.New(transport.Config{Brokers: []string{a}, ClientID: fmt.Sprintf("in-%d", time.Now().UnixNano()), CleanStart: true, KeepAlive: 30 * time.Second,
		ConnectTimeout: 10 * time.Second, ReconcileTimeout: 10 * time.Second, UnmatchedGrace: time.Second,
		Subscriptions: []transport.Subscription{{Filter: "in/#", QoS: 1}}, Handler: d.Handle})
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
	testwait.Until(t, "the session at full service", waitLimit, func() bool { return s.Level() == transport.LevelFull })
}

// seen records what a subscriber received: topic → payload and retain flag.
type seen struct {
	mu  sync.Mutex
	got map[string]string
}

func (s *seen) on(p *paho.Publish) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.got == nil {
		s.got = map[string]string{}
	}
	s.got[p.Topic] = fmt.Sprintf("%s retain=%v", p.Payload, p.Retain)
}

func (s *seen) snapshot() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for k, v := range s.got {
		out[k] = v
	}
	return out
}

func subscribe(t *testing.T, url, filter string) *seen {
	t.Helper()
	s := &seen{}
	c, err := embroker.Connect(context.Background(), url, fmt.Sprintf("sub-%d", time.Now().UnixNano()), true, s.on)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.Subscribe(context.Background(), filter, 1); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRetainedEndToEnd: a message retained on broker A before the bridge
// subscribes (sent at subscribe time) and one published live with the
// retain flag arrive at broker B as the route's retain policy says; a
// fresh subscriber on B shows what B retained.
func TestRetainedEndToEnd(t *testing.T) {
	for _, kind := range []string{"embedded", "mosquitto"} {
		for _, policy := range []routing.RetainPolicy{routing.RetainKeep, routing.RetainClear, routing.RetainDrop} {
			t.Run(fmt.Sprintf("%s/%s", kind, policy), func(t *testing.T) {
				a, b := brokerPair(t, kind)
				publishNow(t, a, &sender.Message{Topic: "in/before", Payload: []byte("before"), QoS: 1, Retain: true})
				live := subscribe(t, b, "out/#")
				runBridge(t, a, b, routing.RouteConfig{Retain: policy})
				publishNow(t, a, &sender.Message{Topic: "in/live", Payload: []byte("live"), QoS: 1, Retain: true})
				publishNow(t, a, &sender.Message{Topic: "in/plain", Payload: []byte("plain"), QoS: 1})
				// One sender connection writes in route order: once
				// "plain" arrived, the two before it were forwarded or
				// dropped.
				testwait.Until(t, "out/plain at broker B", waitLimit, func() bool { _, ok := live.snapshot()["out/plain"]; return ok })
				got := live.snapshot()
				wantLive := 3
				if policy == routing.RetainDrop {
					wantLive = 1
				}
				if len(got) != wantLive {
					t.Fatalf("live subscriber on B got %v, want %d messages", got, wantLive)
				}
				// What B retained: a marker retained last tells when
				// the fresh subscriber has its retained messages.
				publishNow(t, b, &sender.Message{Topic: "out/zz-marker", Payload: []byte("m"), QoS: 1, Retain: true})
				fresh := subscribe(t, b, "out/#")
				testwait.Until(t, "the retained marker", waitLimit, func() bool { _, ok := fresh.snapshot()["out/zz-marker"]; return ok })
				time.Sleep(200 * time.Millisecond) // retained messages are not ordered among topics
				ret := fresh.snapshot()
				delete(ret, "out/zz-marker")
				want := map[string]string{}
				if policy == routing.RetainKeep {
					want = map[string]string{"out/before": "before retain=true", "out/live": "live retain=true"}
				}
				if fmt.Sprint(ret) != fmt.Sprint(want) {
					t.Fatalf("broker B retained %v, want %v", ret, want)
				}
			})
		}
	}
}
