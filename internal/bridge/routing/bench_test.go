package routing_test

import (
	"context"
	"testing"

	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/transport"
	"github.com/myriarch/myriarch/lease"
)

// checking accepts every message after the check a real sender makes at
// its point of action (Message.Withdrawn, which asks the tenure).
type checking struct{}

func (checking) Send(m *sender.Message, done func(error)) {
	if m.Withdrawn() {
		done(sender.ErrWithdrawn)
		return
	}
	done(nil)
}
func (checking) Close(context.Context) error { return nil }

// bootTenure is valid while CLOCK_BOOTTIME is before a far deadline: the
// same clock read as lease.Ownership.Valid.
type bootTenure struct{ clock lease.BootClock }

func (t bootTenure) Valid() bool { return t.clock.Now().Unix() > 0 }

// BenchmarkDeliver is the route's own cost per message and sender: the
// bookkeeping that keeps per-topic order across retries, without I/O.
// "fenced" adds what an exclusive session's tenure costs here per message:
// the route's tenure check, the sender's, and the stamp (the transport adds
// two more checks: intake and acknowledgment). "loop_peer" is a route of a
// loop pair: the check for the peer's stamp and the hop stamp it adds.
func BenchmarkDeliver(b *testing.B) {
	for _, c := range []struct {
		name           string
		fenced, looped bool
	}{{"plain", false, false}, {"fenced", true, false}, {"loop_peer", false, true}} {
		b.Run(c.name, func(b *testing.B) {
			cfg := routing.RouteConfig{ID: "r", Filters: []string{"#"}, Targets: []routing.Target{{ID: "a", Sender: checking{}}}}
			if c.fenced {
				cfg.Fence, cfg.Tenure = fence.New(42, "b/s"), bootTenure{}
			}
			if c.looped {
				cfg.LoopPeer = "peer"
			}
			route := routing.NewRoute(cfg)
			defer route.Close()
			d := &routing.Dispatcher{Session: "s", Routes: []*routing.Route{route}}
			m := &transport.Message{Topic: "plant/1/telemetry", Payload: make([]byte, 256), QoS: 1}
			b.ReportAllocs()
			for b.Loop() {
				d.Handle(m, func() {})
			}
		})
	}
}

// pipeline accepts each message once depth later ones are at it, in
// order, as an MQTT sender's PUBACKs settle a full window.
type pipeline struct {
	depth int
	held  []func(error)
}

func (p *pipeline) Send(m *sender.Message, done func(error)) {
	p.held = append(p.held, done)
	if len(p.held) > p.depth {
		f := p.held[0]
		p.held = p.held[1:]
		f(nil)
	}
}
func (p *pipeline) Close(context.Context) error { return nil }

// BenchmarkDeliverInFlight is BenchmarkDeliver with 1,000 messages of one
// topic in flight, settled in order: the bookkeeping must not grow with the
// depth of the pipeline.
func BenchmarkDeliverInFlight(b *testing.B) {
	p := &pipeline{depth: 1000}
	route := routing.NewRoute(routing.RouteConfig{ID: "r", Filters: []string{"#"}, MaxInFlight: 2000, Targets: []routing.Target{{ID: "a", Sender: p}}})
	defer route.Close()
	d := &routing.Dispatcher{Session: "s", Routes: []*routing.Route{route}}
	m := &transport.Message{Topic: "plant/1/telemetry", Payload: make([]byte, 256), QoS: 1}
	b.ReportAllocs()
	for b.Loop() {
		d.Handle(m, func() {})
	}
}
