package routing_test

import (
	"context"
	"testing"

	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/transport/mqtt"
)

// accept accepts every message on the spot.
type accept struct{}

func (accept) Send(_ *sender.Message, done func(error)) { done(nil) }
func (accept) Close(context.Context) error              { return nil }

// BenchmarkDeliver is the route's own cost per message and sender: the
// bookkeeping that keeps per-topic order across retries, without I/O.
func BenchmarkDeliver(b *testing.B) {
	route := routing.NewRoute(routing.RouteConfig{ID: "r", Filters: []string{"#"}, Targets: []routing.Target{{ID: "a", Sender: accept{}}}})
	defer route.Close()
	m := &mqtt.Message{Topic: "plant/1/telemetry", Payload: make([]byte, 256), QoS: 1}
	b.ReportAllocs()
	for b.Loop() {
		if err := route.Deliver(m, func() {}); err != nil {
			b.Fatal(err)
		}
	}
}
