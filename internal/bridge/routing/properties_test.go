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
	"github.com/myriarch/myriarch/internal/testwait"
)

// collect subscribes on url to filter and keeps every PUBLISH.
func collect(t *testing.T, url, filter string) func() []*paho.Publish {
	t.Helper()
	var mu sync.Mutex
	var got []*paho.Publish
	c, err := embroker.Connect(context.Background(), url, fmt.Sprintf("col-%d", time.Now().UnixNano()), true, func(p *paho.Publish) {
		mu.Lock()
		got = append(got, p)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.Subscribe(context.Background(), filter, 1); err != nil {
		t.Fatal(err)
	}
	return func() []*paho.Publish {
		mu.Lock()
		defer mu.Unlock()
		return append([]*paho.Publish(nil), got...)
	}
}

// TestPropertiesCarriedThrough: user properties (order, repeated keys),
// content type, payload format, message expiry, response topic (mapped
// like the topic) and correlation data cross broker A → bridge → broker B.
func TestPropertiesCarriedThrough(t *testing.T) {
	for _, kind := range []string{"embedded", "mosquitto"} {
		t.Run(kind, func(t *testing.T) {
			a, b := brokerPair(t, kind)
			got := collect(t, b, "out/#")
			runBridge(t, a, b, routing.RouteConfig{})
			utf8, expiry := byte(1), uint32(600)
			publishNow(t, a, &sender.Message{Topic: "in/req", Payload: []byte(`{"q":1}`), QoS: 1, Received: time.Now(),
				Properties: &sender.Properties{
					User:        []sender.UserProperty{{Key: "k", Value: "1"}, {Key: "trace", Value: "abc"}, {Key: "k", Value: "2"}},
					ContentType: "application/json", PayloadFormat: &utf8, MessageExpiry: &expiry,
					ResponseTopic: "in/reply/7", CorrelationData: []byte{0, 1, 2}}})
			testwait.Until(t, "the message at broker B", waitLimit, func() bool { return len(got()) > 0 })
			p := got()[0]
			pp := p.Properties
			if p.Topic != "out/req" || pp == nil {
				t.Fatalf("got %s with properties %+v", p.Topic, pp)
			}
			if u := fmt.Sprint(pp.User); u != "[{k 1} {trace abc} {k 2}]" {
				t.Errorf("user properties %s", u)
			}
			if pp.ContentType != "application/json" || pp.PayloadFormat == nil || *pp.PayloadFormat != 1 {
				t.Errorf("content type %q, payload format %v", pp.ContentType, pp.PayloadFormat)
			}
			if pp.MessageExpiry == nil || *pp.MessageExpiry > 600 || *pp.MessageExpiry < 590 {
				t.Errorf("message expiry %v, want a little under 600", pp.MessageExpiry)
			}
			if pp.ResponseTopic != "out/reply/7" || string(pp.CorrelationData) != "\x00\x01\x02" {
				t.Errorf("response topic %q, correlation data %x", pp.ResponseTopic, pp.CorrelationData)
			}
		})
	}
}

// TestMessageExpiryInTheBridge: the MQTT sender publishes what remains of
// a message's expiry after its time in the bridge, and does not publish
// one that expired there (it counts as delivered).
func TestMessageExpiryInTheBridge(t *testing.T) {
	for _, kind := range []string{"embedded", "mosquitto"} {
		t.Run(kind, func(t *testing.T) {
			_, b := brokerPair(t, kind)
			got := collect(t, b, "x/#")
			s := mqttsender.New(mqttsender.Config{Broker: b, ClientID: "exp", QoS: 1, KeepAlive: 30 * time.Second})
			defer s.Close(context.Background())
			ten := uint32(10)
			for _, m := range []*sender.Message{
				{Topic: "x/a", Payload: []byte("held 3s"), QoS: 1, Received: time.Now().Add(-3 * time.Second), Properties: &sender.Properties{MessageExpiry: &ten}},
				{Topic: "x/a", Payload: []byte("held 20s"), QoS: 1, Received: time.Now().Add(-20 * time.Second), Properties: &sender.Properties{MessageExpiry: &ten}},
				{Topic: "x/a", Payload: []byte("no expiry"), QoS: 1, Received: time.Now()},
			} {
				done := make(chan error, 1)
				s.Send(m, func(err error) { done <- err })
				select {
				case err := <-done:
					if err != nil {
						t.Fatalf("%s: %v", m.Payload, err)
					}
				case <-time.After(30 * time.Second):
					t.Fatalf("%s: no outcome", m.Payload)
				}
			}
			testwait.Until(t, "the last message", waitLimit, func() bool { return len(got()) >= 2 })
			ps := got()
			if len(ps) != 2 || string(ps[0].Payload) != "held 3s" || string(ps[1].Payload) != "no expiry" {
				t.Fatalf("got %d messages: %v", len(ps), ps)
			}
			if e := ps[0].Properties.MessageExpiry; e == nil || *e > 7 || *e < 5 {
				t.Fatalf("expiry after 3s in the bridge: %v, want 7 (less what the broker held it)", e)
			}
			if ps[1].Properties != nil && ps[1].Properties.MessageExpiry != nil {
				t.Fatalf("a message without expiry got one: %v", *ps[1].Properties.MessageExpiry)
			}
		})
	}
}
