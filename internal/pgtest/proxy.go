package pgtest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
)

// Proxy is a TCP proxy in front of a PostgreSQL server for fault tests. It
// can freeze its connections (stop forwarding in both directions without
// closing anything, so neither side sees a FIN) and can refuse startup
// packets that carry a given parameter, the way a server that does not
// support tcp_user_timeout does.
type Proxy struct {
	// Addr is the host:port the proxy listens on.
	Addr string

	target string
	ln     net.Listener
	// RefuseParam, when set before the first connection, makes the proxy
	// answer a startup packet that contains this parameter with a FATAL
	// ErrorResponse (SQLSTATE 22023) instead of forwarding it.
	refuseParam string

	mu      sync.Mutex
	frozen  bool
	conns   []net.Conn
	refused int
	closed  chan struct{}
	wg      sync.WaitGroup
}

// NewProxy listens on a free loopback port and forwards to target
// (host:port). refuseParam may be empty.
func NewProxy(target, refuseParam string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, refuseParam: refuseParam, closed: make(chan struct{})}
	p.wg.Go(p.accept)
	return p, nil
}

// HostPort returns the listen host and port.
func (p *Proxy) HostPort() (string, int) {
	a := p.ln.Addr().(*net.TCPAddr)
	return a.IP.String(), a.Port
}

// Freeze stops forwarding on every current and future connection. Bytes
// stay in the kernel buffers; no side sees a FIN or RST until Close.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	p.frozen = true
	p.mu.Unlock()
}

// Refused returns how many startup packets the proxy refused.
func (p *Proxy) Refused() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// Close closes the listener and every connection and waits for the
// forwarding goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	select {
	case <-p.closed:
	default:
		close(p.closed)
	}
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	err := p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.closed:
		c.Close()
		return false
	default:
	}
	p.conns = append(p.conns, c)
	return true
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Go(func() { p.serve(c) })
	}
}

func (p *Proxy) serve(client net.Conn) {
	startup, refuse, err := readStartup(client, p.refuseParam)
	if err != nil {
		client.Close()
		return
	}
	if refuse != "" {
		p.mu.Lock()
		p.refused++
		p.mu.Unlock()
		_, _ = client.Write(errorResponse("22023", fmt.Sprintf("invalid value for parameter %q: %q", p.refuseParam, refuse)))
		client.Close()
		return
	}
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(server) {
		client.Close()
		return
	}
	if _, err := server.Write(startup); err != nil {
		client.Close()
		server.Close()
		return
	}
	p.wg.Go(func() { p.pipe(server, client) })
	p.pipe(client, server)
}

// pipe copies from src to dst until an error or a freeze. When frozen it
// holds both connections open until Close, so that the peers see nothing.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		if p.isFrozen() {
			<-p.closed
			return
		}
		n, err := src.Read(buf)
		if n > 0 {
			if p.isFrozen() {
				<-p.closed
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if p.isFrozen() {
				<-p.closed
				return
			}
			// Pass the close on like a normal proxy.
			if tc, ok := dst.(*net.TCPConn); ok && errors.Is(err, io.EOF) {
				_ = tc.CloseWrite()
			} else {
				dst.Close()
			}
			return
		}
	}
}

func (p *Proxy) isFrozen() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.frozen
}

// readStartup reads the startup packet (answering an SSLRequest or
// GSSENCRequest with 'N') and returns its bytes and, when refuseParam is
// among its parameters, that parameter's value.
func readStartup(c net.Conn, refuseParam string) ([]byte, string, error) {
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return nil, "", err
		}
		n := binary.BigEndian.Uint32(hdr[:4])
		code := binary.BigEndian.Uint32(hdr[4:])
		if n < 8 || n > 1<<16 {
			return nil, "", fmt.Errorf("pgtest proxy: bad startup length %d", n)
		}
		body := make([]byte, n-8)
		if _, err := io.ReadFull(c, body); err != nil {
			return nil, "", err
		}
		if code == 80877103 || code == 80877104 { // SSLRequest, GSSENCRequest
			if _, err := c.Write([]byte{'N'}); err != nil {
				return nil, "", err
			}
			continue
		}
		msg := append(hdr[:], body...)
		if refuseParam == "" || code != 196608 {
			return msg, "", nil
		}
		parts := strings.Split(string(body), "\x00")
		for i := 0; i+1 < len(parts); i += 2 {
			if parts[i] == refuseParam {
				return msg, parts[i+1], nil
			}
		}
		return msg, "", nil
	}
}

func errorResponse(code, message string) []byte {
	var body []byte
	for _, f := range []struct {
		t byte
		v string
	}{{'S', "FATAL"}, {'V', "FATAL"}, {'C', code}, {'M', message}} {
		body = append(body, f.t)
		body = append(body, f.v...)
		body = append(body, 0)
	}
	body = append(body, 0)
	out := []byte{'E', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(out[1:], uint32(len(body)+4))
	return append(out, body...)
}
