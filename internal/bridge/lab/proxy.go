package lab

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// Proxy forwards TCP connections to a target. Blackhole makes it swallow
// every byte in both directions without closing anything — no FIN, no
// RST — which is what a lost route looks like to both ends: only
// keepalives notice. Refuse makes it close every new connection at once,
// the way a firewall's reject or a broker's ACL looks to a client.
// SwallowReplies swallows only what the target sends (a PUBACK that never
// arrives), and Cut closes the open connections, a dropped link that both
// ends notice at once.
type Proxy struct {
	l        net.Listener
	target   string
	hole     atomic.Bool
	replies  atomic.Bool
	refuse   atomic.Bool
	accepted atomic.Int64

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewProxy listens on a free loopback port and forwards to target.
func NewProxy(target string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{l: l, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Blackhole starts (true) or ends (false) swallowing traffic.
func (p *Proxy) Blackhole(on bool) { p.hole.Store(on) }

// SwallowReplies starts (true) or ends (false) swallowing what the target
// sends, while what the client sends still arrives.
func (p *Proxy) SwallowReplies(on bool) { p.replies.Store(on) }

// Cut closes every open connection; new ones are accepted as before.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// Refuse starts (true) or ends (false) closing new connections at once.
func (p *Proxy) Refuse(on bool) { p.refuse.Store(on) }

// Accepted is how many connections the proxy accepted so far, refused ones
// included: through a proxy that only one client uses, a count that grows
// is that client reconnecting.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		if p.refuse.Load() {
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(c) || !p.track(up) {
			_ = c.Close()
			_ = up.Close()
			return
		}
		p.wg.Add(2)
		go p.pipe(c, up, true)
		go p.pipe(up, c, false)
	}
}

// pipe copies src to dst; reply says src is the target.
func (p *Proxy) pipe(dst, src net.Conn, reply bool) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.hole.Load() && !(reply && p.replies.Load()) {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			if err != io.EOF || !p.hole.Load() {
				_ = dst.Close()
				_ = src.Close()
			}
			return
		}
	}
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() error {
	err := p.l.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
	return err
}
