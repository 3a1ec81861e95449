package routing_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	mqttsender "github.com/myriarch/myriarch/internal/bridge/sender/mqtt"
	"github.com/myriarch/myriarch/internal/testwait"
)

// TestSenderQoS2: an mqtt sender at QoS 2 completes PUBLISH, PUBREC,
// PUBREL, PUBCOMP for each message, reports acceptance at PUBCOMP, keeps
// the order, and the subscriber receives QoS 2 messages once each.
func TestSenderQoS2(t *testing.T) {
	for _, kind := range []string{"embedded", "mosquitto"} {
		t.Run(kind, func(t *testing.T) {
			_, b := brokerPair(t, kind)
			var mu sync.Mutex
			var got []string
			c, err := embroker.Connect(context.Background(), b, "qos2-sub", true, func(p *paho.Publish) {
				mu.Lock()
				got = append(got, fmt.Sprintf("%s q%d", p.Payload, p.QoS))
				mu.Unlock()
			})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := c.Subscribe(context.Background(), "q/#", 2); err != nil {
				t.Fatal(err)
			}
			s := mqttsender.New(mqttsender.Config{Broker: b, ClientID: "qos2-out", QoS: 2, KeepAlive: 30 * time.Second})
			defer s.Close(context.Background())
			const n = 300
			results := make(chan error, n)
			for i := range n {
				s.Send(&sender.Message{Topic: "q/x", Payload: fmt.Appendf(nil, "%d", i), QoS: 2}, func(err error) { results <- err })
			}
			for range n {
				select {
				case err := <-results:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(30 * time.Second):
					t.Fatal("no PUBCOMP within 30s")
				}
			}
			testwait.Until(t, "every message at the subscriber", waitLimit, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= n })
			time.Sleep(100 * time.Millisecond) // a duplicate would arrive right behind
			mu.Lock()
			defer mu.Unlock()
			if len(got) != n {
				t.Fatalf("got %d messages for %d sent", len(got), n)
			}
			for i, g := range got {
				if g != fmt.Sprintf("%d q2", i) {
					t.Fatalf("message %d: %q", i, g)
				}
			}
		})
	}
}
