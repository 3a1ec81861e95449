// Package faultnet is the one TCP fault proxy of the module's tests and
// labs: a forwarder on a loopback listener that the test or lab owns, in
// front of a server, which can be made to fail the way networks and hosts
// fail. Production binaries never link it.
//
// The faults, and what each looks like to the two ends:
//   - Blackhole: every byte in both directions is read and thrown away,
//     nothing is closed (no FIN, no RST): a lost route; only keepalives
//     and timeouts notice.
//   - Freeze: forwarding stops and nothing is read any more, so bytes stay
//     in the kernel buffers until they fill; nothing is closed until Close:
//     a frozen peer (SIGSTOP) or a wedged path.
//   - SwallowReplies: what the server sends is thrown away, what the
//     client sends still arrives: a reply (a PUBACK) that never comes.
//   - DelayReplies: what the server sends reaches the client late (each
//     chunk held for the delay, so a stream of them queues up): a slow or
//     congested path, a starved peer; the handshake and every reply
//     outlast their timeouts when the delay is long enough.
//   - Cut: the open connections are closed, a dropped link both ends see.
//   - Refuse: new connections are closed at once, a firewall's reject.
//   - SetTargets(): no target closes new connections as well; a new target
//     sends new connections to a server restarted on another port while
//     clients keep dialling the proxy's address, which nothing else can
//     take in between.
package faultnet

import (
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Options change how a Proxy treats each connection.
type Options struct {
	// Handshake, when set, runs on each accepted connection before the
	// server is dialled. It returns the bytes to send to the server first
	// (what it read from the client), or an error to close the client
	// (after writing the client an answer of its own if it wants to).
	Handshake func(client net.Conn) (toServer []byte, err error)
	// BufferSize of each direction's copy; 32 KiB when 0.
	BufferSize int
	// DialTimeout for the server; 5 s when 0.
	DialTimeout time.Duration
}

// Proxy forwards TCP connections to its targets, round robin, trying the
// next target when one cannot be dialled.
type Proxy struct {
	l                             net.Listener
	o                             Options
	hole, replies, refuse, frozen atomic.Bool
	accepted                      atomic.Int64
	replyDelay                    atomic.Int64 // nanoseconds
	next                          atomic.Uint64
	closed                        chan struct{}

	mu      sync.Mutex
	targets []string
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// Listen starts a proxy on a free loopback port in front of targets
// (none: it closes every connection until SetTargets).
func Listen(o Options, targets ...string) (*Proxy, error) {
	return ListenOn("127.0.0.1:0", o, targets...)
}

// ListenOn is Listen on a given address.
func ListenOn(addr string, o Options, targets ...string) (*Proxy, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if o.BufferSize <= 0 {
		o.BufferSize = 32 << 10
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	p := &Proxy{l: l, o: o, targets: targets, conns: map[net.Conn]struct{}{}, closed: make(chan struct{})}
	p.wg.Go(p.accept)
	return p, nil
}

// Addr is the address clients dial (host:port).
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// HostPort is Addr split.
func (p *Proxy) HostPort() (string, int) {
	h, port, _ := net.SplitHostPort(p.Addr())
	n, _ := strconv.Atoi(port)
	return h, n
}

// SetTargets sends new connections to targets (none: closes them); open
// ones stay as they are.
func (p *Proxy) SetTargets(targets ...string) {
	p.mu.Lock()
	p.targets = append([]string(nil), targets...)
	p.mu.Unlock()
}

// Blackhole starts (true) or ends (false) throwing every byte away.
func (p *Proxy) Blackhole(on bool) { p.hole.Store(on) }

// SwallowReplies starts (true) or ends (false) throwing away what the
// server sends.
func (p *Proxy) SwallowReplies(on bool) { p.replies.Store(on) }

// DelayReplies holds every chunk the server sends for d before it is
// forwarded (0 ends it; chunks already held keep their delay).
func (p *Proxy) DelayReplies(d time.Duration) { p.replyDelay.Store(int64(d)) }

// Freeze stops forwarding on every current and future connection for good:
// nothing is read or closed until Close.
func (p *Proxy) Freeze() { p.frozen.Store(true) }

// Refuse starts (true) or ends (false) closing new connections at once.
func (p *Proxy) Refuse(on bool) { p.refuse.Store(on) }

// Cut closes every open connection; new ones are accepted as before.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// Accepted is how many connections the proxy accepted so far, refused ones
// included: through a proxy that only one client uses, a count that grows
// is that client reconnecting.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// Close stops the proxy, closes every connection and waits for its
// goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	select {
	case <-p.closed:
		p.mu.Unlock()
		return nil
	default:
		close(p.closed)
	}
	err := p.l.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// track registers c for Cut and Close; false when the proxy is closed (c
// is closed then).
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
		if p.conns != nil {
			delete(p.conns, c)
		}
	}
}

func (p *Proxy) accept() {
	for {
		c, err := p.l.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of descriptors, say (a load proxy holds thousands):
			// wait and go on rather than stop accepting for good.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.accepted.Add(1)
		if p.refuse.Load() || !p.track(c) {
			_ = c.Close()
			continue
		}
		p.wg.Go(func() { p.serve(c) })
	}
}

func (p *Proxy) serve(client net.Conn) {
	var first []byte
	if p.o.Handshake != nil {
		var err error
		if first, err = p.o.Handshake(client); err != nil {
			p.untrack(client)
			return
		}
	}
	server, err := p.dial()
	if err != nil || !p.track(server) {
		p.untrack(client)
		return
	}
	if len(first) > 0 {
		if _, err := server.Write(first); err != nil {
			p.untrack(client, server)
			return
		}
	}
	done := make(chan struct{})
	p.wg.Go(func() {
		defer close(done)
		p.pipe(server, client, false)
	})
	p.pipe(client, server, true)
	<-done
	p.untrack(client, server)
}

// dial connects to the next target, trying each once.
func (p *Proxy) dial() (net.Conn, error) {
	p.mu.Lock()
	ts := p.targets
	p.mu.Unlock()
	if len(ts) == 0 {
		return nil, errors.New("faultnet: no target")
	}
	i := p.next.Add(1)
	var err error
	for k := range ts {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", ts[(int(i)+k)%len(ts)], p.o.DialTimeout); err == nil {
			return c, nil
		}
	}
	return nil, err
}

// pipe copies src to dst; reply says src is the server. When either end
// closes, both are closed, unless the path is blackholed (the FIN is lost
// too); on a freeze it stops reading and holds both ends open until Close.
func (p *Proxy) pipe(dst, src net.Conn, reply bool) {
	buf := make([]byte, p.o.BufferSize)
	for {
		if p.frozen.Load() {
			<-p.closed
			return
		}
		n, err := src.Read(buf)
		if p.frozen.Load() {
			<-p.closed
			return
		}
		if n > 0 && reply {
			if d := time.Duration(p.replyDelay.Load()); d > 0 {
				select {
				case <-time.After(d):
				case <-p.closed:
					return
				}
			}
		}
		if n > 0 && !p.hole.Load() && !(reply && p.replies.Load()) {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				_ = src.Close()
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && p.hole.Load() {
				// A lost route loses the FIN as well: hold on.
				<-p.closed
				return
			}
			// Either end closing closes both, so that the client sees
			// the server go and the server the client.
			_ = dst.Close()
			_ = src.Close()
			return
		}
	}
}
