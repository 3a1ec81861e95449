package testnet

import (
	"testing"

	"github.com/myriarch/myriarch/internal/faultnet"
)

// Relay is a TCP forwarder on a listener bound by the test, in front of a
// server the test restarts. The server comes back on a fresh port behind
// it while clients keep dialling the relay's address, which nothing else
// can take in between; restarting a server on its old port races every
// other listener and outgoing connection on the machine for that port.
// With no target the relay closes each connection it accepts, which a
// client sees as a server that is not there.
type Relay struct {
	p *faultnet.Proxy
}

// NewRelay starts a relay to target ("" for none); the test's cleanup
// closes it and its connections.
func NewRelay(t testing.TB, target string) *Relay {
	t.Helper()
	var targets []string
	if target != "" {
		targets = []string{target}
	}
	p, err := faultnet.Listen(faultnet.Options{}, targets...)
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{p: p}
	t.Cleanup(r.Close)
	return r
}

// Addr is the address clients dial (host:port).
func (r *Relay) Addr() string { return r.p.Addr() }

// SetTarget sends new connections to target ("" refuses them); open ones
// stay as they are. Set "" before stopping the server, so that no client
// reaches whatever binds the old port next.
func (r *Relay) SetTarget(target string) {
	if target == "" {
		r.p.SetTargets()
		return
	}
	r.p.SetTargets(target)
}

// Close stops the relay and closes every connection through it.
func (r *Relay) Close() { _ = r.p.Close() }
