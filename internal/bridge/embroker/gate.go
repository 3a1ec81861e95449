package embroker

import (
	"sync"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// takeoverGate closes a race in mochi-mqtt v2.7.9's session takeover: when
// a client resumes a session whose previous connection object still
// exists, mochi clones the old object's in-flight messages, then clears
// them, and only then registers the new connection. A message published in
// between is queued on the old object after the clone and cleared with it:
// the lab measured two such losses per takeover at 200 msg/s. The gate
// holds new publishes while a takeover runs and lets it wait for the ones
// already being distributed, each wait capped at a second so that a
// publish path that skips a hook cannot wedge the broker.
type takeoverGate struct {
	mochi.HookBase
	server *mochi.Server

	mu         sync.Mutex
	closed     int
	publishing int
	waiting    map[*mochi.Client]bool
}

func (g *takeoverGate) ID() string { return "myriarch-takeover-gate" }

func (g *takeoverGate) Provides(b byte) bool {
	return b == mochi.OnSessionEstablish || b == mochi.OnPublish || b == mochi.OnPublished || b == mochi.OnPacketEncode
}

const gateLimit = time.Second

func (g *takeoverGate) OnPublish(_ *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	deadline := time.Now().Add(gateLimit)
	for {
		g.mu.Lock()
		if g.closed == 0 || time.Now().After(deadline) {
			g.publishing++
			g.mu.Unlock()
			return pk, nil
		}
		g.mu.Unlock()
		time.Sleep(200 * time.Microsecond)
	}
}

func (g *takeoverGate) OnPublished(*mochi.Client, packets.Packet) {
	g.mu.Lock()
	if g.publishing > 0 {
		g.publishing--
	}
	g.mu.Unlock()
}

func (g *takeoverGate) OnSessionEstablish(cl *mochi.Client, _ packets.Packet) {
	if _, ok := g.server.Clients.Get(cl.ID); !ok {
		return // no takeover
	}
	g.mu.Lock()
	if g.waiting == nil {
		g.waiting = map[*mochi.Client]bool{}
	}
	g.waiting[cl] = true
	g.closed++
	g.mu.Unlock()
	time.AfterFunc(gateLimit, func() { g.open(cl) })
	deadline := time.Now().Add(gateLimit)
	for time.Now().Before(deadline) {
		g.mu.Lock()
		n := g.publishing
		g.mu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// OnPacketEncode reopens the gate at the CONNACK: by then the new
// connection is registered and receives what is published.
func (g *takeoverGate) OnPacketEncode(cl *mochi.Client, pk packets.Packet) packets.Packet {
	if pk.FixedHeader.Type == packets.Connack {
		g.open(cl)
	}
	return pk
}

func (g *takeoverGate) open(cl *mochi.Client) {
	g.mu.Lock()
	if g.waiting[cl] {
		delete(g.waiting, cl)
		g.closed--
	}
	g.mu.Unlock()
}
