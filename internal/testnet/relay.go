package testnet

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Relay is a TCP forwarder on a listener bound by the test, in front of a
// server the test restarts. The server comes back on a fresh port behind
// it while clients keep dialling the relay's address, which nothing else
// can take in between; restarting a server on its old port races every
// other listener and outgoing connection on the machine for that port.
// With no target the relay closes each connection it accepts, which a
// client sees as a server that is not there.
type Relay struct {
	l  net.Listener
	wg sync.WaitGroup

	mu     sync.Mutex
	target string
	conns  map[net.Conn]struct{}
}

// NewRelay starts a relay to target ("" for none); the test's cleanup
// closes it and its connections.
func NewRelay(t testing.TB, target string) *Relay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{l: l, target: target, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(r.Close)
	return r
}

// Addr is the address clients dial (host:port).
func (r *Relay) Addr() string { return r.l.Addr().String() }

// SetTarget sends new connections to target ("" refuses them); open ones
// stay as they are. Set "" before stopping the server, so that no client
// reaches whatever binds the old port next.
func (r *Relay) SetTarget(target string) {
	r.mu.Lock()
	r.target = target
	r.mu.Unlock()
}

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.l.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		target := r.target
		r.mu.Unlock()
		if target == "" {
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", target)
		if err != nil {
			_ = c.Close()
			continue
		}
		r.mu.Lock()
		if r.conns == nil {
			r.mu.Unlock()
			_ = c.Close()
			_ = up.Close()
			return
		}
		r.conns[c], r.conns[up] = struct{}{}, struct{}{}
		r.mu.Unlock()
		r.wg.Add(2)
		go r.pipe(c, up)
		go r.pipe(up, c)
	}
}

// pipe copies src to dst; when either direction ends both connections are
// closed, so the client sees the server's close and the server the
// client's.
func (r *Relay) pipe(dst, src net.Conn) {
	defer r.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
	r.mu.Lock()
	if r.conns != nil {
		delete(r.conns, dst)
		delete(r.conns, src)
	}
	r.mu.Unlock()
}

// Close stops the relay and closes every connection through it.
func (r *Relay) Close() {
	_ = r.l.Close()
	r.mu.Lock()
	for c := range r.conns {
		_ = c.Close()
	}
	r.conns = nil
	r.mu.Unlock()
	r.wg.Wait()
}
