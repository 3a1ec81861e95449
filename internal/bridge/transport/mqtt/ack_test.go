package mqtt_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/transport"
	"github.com/myriarch/myriarch/internal/bridge/transport/mqtt"
	"github.com/myriarch/myriarch/internal/testwait"
)

// held is a message the test handler keeps with its ack.
type held struct {
	m   *transport.Message
	ack func()
}

// runHolding runs a session "ack" on broker url that keeps every message
// and its ack in the returned channel; stop disconnects it (the broker
// keeps the session for an hour).
func runHolding(t *testing.T, url, filter string, qos byte) (got chan held, stop func()) {
	t.Helper()
	got = make(chan held, 1000)
	s, err := mqtt.New(transport.Config{Brokers: []string{url}, ClientID: "ack", SessionExpiry: time.Hour, KeepAlive: 5 * time.Second,
		ConnectTimeout: 5 * time.Second, ReconcileTimeout: 5 * time.Second, UnmatchedGrace: time.Second,
		Subscriptions: []transport.Subscription{{Filter: filter, QoS: qos}},
		Handler:       func(m *transport.Message, ack func()) { got <- held{m, ack} }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = s.Run(ctx) }()
	testwait.Until(t, "full", waitLimit, func() bool { return s.Level() == transport.LevelFull })
	return got, func() { cancel(); <-ran }
}

func next(t *testing.T, got chan held) held {
	t.Helper()
	select {
	case h := <-got:
		return h
	case <-time.After(20 * time.Second):
		t.Fatal("no message within 20s")
		return held{}
	}
}

func publishN(t *testing.T, url, topic string, qos byte, from, n int) {
	t.Helper()
	pub, err := embroker.Connect(context.Background(), url, fmt.Sprintf("pub-%d", from), true, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for i := from; i < from+n; i++ {
		if _, err := pub.Publish(context.Background(), &paho.Publish{Topic: topic, QoS: qos, Payload: fmt.Appendf(nil, "%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
}

// inflight is the number of messages the broker holds unacknowledged
// for the session "ack" (-1: no such client).
func inflight(b *embroker.Broker) int {
	cl, ok := b.Server.Clients.Get("ack")
	if !ok {
		return -1
	}
	return cl.State.Inflight.Len()
}

// Acknowledgments leave in the order the messages arrived, as MQTT
// requires: messages 2 and 3 acknowledged before message 1 stay
// unacknowledged on the broker until message 1 is acknowledged, and then
// all three go.
func TestAcksLeaveInArrivalOrder(t *testing.T) {
	b, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got, stop := runHolding(t, b.URL, "o/#", 1)
	defer stop()
	publishN(t, b.URL, "o/x", 1, 1, 3)
	var hs []held
	for i := 1; i <= 3; i++ {
		h := next(t, got)
		if string(h.m.Payload) != fmt.Sprint(i) {
			t.Fatalf("got %q, want %d", h.m.Payload, i)
		}
		hs = append(hs, h)
	}
	hs[1].ack()
	hs[2].ack()
	time.Sleep(300 * time.Millisecond) // time for wrongly ordered acks to reach the broker
	if n := inflight(b); n != 3 {
		t.Fatalf("the broker holds %d unacknowledged messages after acks of 2 and 3 before 1, want 3", n)
	}
	hs[0].ack()
	testwait.Until(t, "all three acknowledged", waitLimit, func() bool { return inflight(b) == 0 })
}

// QoS 2 inbound: the session answers PUBLISH with PUBREC when the handler
// acknowledges, and PUBREL with PUBCOMP, so the broker completes every
// exchange; an unacknowledged QoS 2 message is redelivered to a resumed
// session.
func TestQoS2Inbound(t *testing.T) {
	b, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got, stop := runHolding(t, b.URL, "q/#", 2)
	publishN(t, b.URL, "q/x", 2, 1, 3)
	var last held
	for i := 1; i <= 3; i++ {
		h := next(t, got)
		if h.m.QoS != 2 || string(h.m.Payload) != fmt.Sprint(i) {
			t.Fatalf("got QoS %d %q, want QoS 2 %d", h.m.QoS, h.m.Payload, i)
		}
		if i < 3 {
			h.ack()
		} else {
			last = h
		}
	}
	testwait.Until(t, "two exchanges completed", waitLimit, func() bool { return inflight(b) == 1 })
	stop()
	_ = last

	got, stop = runHolding(t, b.URL, "q/#", 2)
	defer stop()
	h := next(t, got)
	if string(h.m.Payload) != "3" {
		t.Fatalf("redelivered %q, want 3", h.m.Payload)
	}
	h.ack()
	testwait.Until(t, "every exchange completed", waitLimit, func() bool { return inflight(b) == 0 })
}

// Acknowledgments released in a burst share writes (they wait a moment
// for each other); every one of them still reaches the broker.
func TestBurstOfAcksAllArrive(t *testing.T) {
	b, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got, stop := runHolding(t, b.URL, "burst/#", 1)
	defer stop()
	const n = 300
	publishN(t, b.URL, "burst/x", 1, 1, n)
	var hs []held
	for range n {
		hs = append(hs, next(t, got))
	}
	for _, h := range hs {
		h.ack()
	}
	testwait.Until(t, "all acknowledged", waitLimit, func() bool { return inflight(b) == 0 })
}
