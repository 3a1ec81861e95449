// Package mqttconn dials MQTT brokers for the bridge's transport and its
// MQTT sender and wraps the connection so that a forwarded message costs
// few system calls: reads go through a buffer, and writes are coalesced,
// so that a burst of PUBLISH or PUBACK packets leaves in one write instead
// of one per packet (paho.golang writes every packet, and every part of a
// packet, with its own call). It also encodes and decodes the hot path's
// packets itself (codec.go).
package mqttconn

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// TLSFiles names the PEM files of a TLS client configuration.
type TLSFiles struct {
	CAFile, CertFile, KeyFile, ServerName string
	InsecureSkipVerify                    bool
}

// TLSConfig loads the files into a tls.Config; nil files mean no TLS.
func TLSConfig(f *TLSFiles) (*tls.Config, error) {
	if f == nil {
		return nil, nil
	}
	c := &tls.Config{ServerName: f.ServerName, InsecureSkipVerify: f.InsecureSkipVerify, MinVersion: tls.VersionTLS12} //nolint:gosec // operator's explicit choice
	if f.CAFile != "" {
		pem, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no PEM certificates", f.CAFile)
		}
		c.RootCAs = pool
	}
	if f.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, err
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// Dial connects to broker (tcp://, mqtt://, ssl://, tls:// or mqtts://)
// within ctx and returns the buffered connection.
func Dial(ctx context.Context, broker string, tlsCfg *tls.Config) (*Conn, error) {
	u, err := url.Parse(broker)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	var c net.Conn
	switch u.Scheme {
	case "tcp", "mqtt":
		c, err = d.DialContext(ctx, "tcp", u.Host)
	case "ssl", "tls", "mqtts":
		cfg := tlsCfg
		if cfg == nil {
			cfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		if cfg.ServerName == "" {
			cfg = cfg.Clone()
			cfg.ServerName = u.Hostname()
		}
		// TLS over the raw system calls of the TCP connection (raw.go),
		// like tls.Dialer otherwise.
		var tcp net.Conn
		if tcp, err = d.DialContext(ctx, "tcp", u.Host); err != nil {
			return nil, err
		}
		if tc, ok := tcp.(*net.TCPConn); ok {
			if raw := newRawIO(tc); raw != nil {
				tcp = &rawTCP{TCPConn: tc, raw: raw}
			}
		}
		tc := tls.Client(tcp, cfg)
		if err = tc.HandshakeContext(ctx); err != nil {
			_ = tcp.Close()
			return nil, err
		}
		c = tc
	default:
		return nil, fmt.Errorf("broker %q: unsupported scheme %q", broker, u.Scheme)
	}
	if err != nil {
		return nil, err
	}
	return Wrap(c), nil
}

// Conn is a net.Conn with buffered reads and coalesced writes: a writer
// that finds no write in progress writes itself, and whatever other
// goroutines queue meanwhile leaves with its next write, so a burst of
// PUBLISH or PUBACK packets costs one system call and no goroutine is
// woken to write (a flusher goroutine cost a wake-up per burst).
//
// Whole packets go in with WritePacket (or Write). Conn also implements
// sync.Locker for paho.golang's codec, which writes a packet in parts:
// parts written between Lock and Unlock leave together at Unlock.
type Conn struct {
	net.Conn
	r       *bufio.Reader
	src     io.Reader // what r reads: the connection, or its raw system calls
	read    int       // bytes read through ReadPacket while r is small
	big     bool      // r has bufSize
	w       io.Writer // the connection, or its raw system calls (raw.go)
	scratch []byte    // ReadPacket's body of packets other than PUBLISH

	packet   sync.Mutex  // held across the parts of one packet (sync.Locker)
	inPacket atomic.Bool // between Lock and Unlock
	stage    []byte      // the parts of the packet being written, under packet

	mu      sync.Mutex
	idle    *sync.Cond // on mu: no write in progress
	buf     []byte
	spare   []byte
	err     error
	writing bool
	closed  bool
}

// bufSize is the read buffer of a busy connection and the write buffer
// kept between writes. A connection starts with a read buffer of
// smallBufSize and no write buffer, and takes the large read buffer once
// it has read bufSize bytes: one process may hold thousands of sessions
// (one connection each) that carry a message now and then, and 192 KiB
// of buffers per connection would be most of their memory.
const (
	bufSize      = 64 << 10
	smallBufSize = 4 << 10
)

// Wrap wraps c.
func Wrap(c net.Conn) *Conn {
	var rw io.ReadWriter = c
	if tc, ok := c.(*net.TCPConn); ok {
		if raw := newRawIO(tc); raw != nil {
			rw = raw
		}
	}
	w := &Conn{Conn: c, src: rw, r: bufio.NewReaderSize(rw, smallBufSize), w: rw}
	w.idle = sync.NewCond(&w.mu)
	return w
}

// Lock starts a packet written in parts (paho.golang's codec).
func (c *Conn) Lock() {
	c.packet.Lock()
	c.inPacket.Store(true)
}

// Unlock queues the parts written since Lock as one packet.
func (c *Conn) Unlock() {
	if len(c.stage) > 0 {
		_ = c.WritePacket(c.stage)
		c.stage = c.stage[:0]
	}
	c.inPacket.Store(false)
	c.packet.Unlock()
}

func (c *Conn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Write adds p to the packet being written between Lock and Unlock, or
// outside them writes p as a whole packet (WritePacket). A goroutine that
// writes parts must hold the lock: a Write without it while another
// goroutine holds it would join that packet. It fails once the connection
// failed.
func (c *Conn) Write(p []byte) (int, error) {
	if !c.inPacket.Load() {
		if err := c.WritePacket(p); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	c.mu.Lock()
	err := c.err
	c.mu.Unlock()
	if err != nil {
		return 0, err
	}
	c.stage = append(c.stage, p...)
	return len(p), nil
}

// WritePacket queues one whole encoded packet and, unless another
// goroutine is writing, writes everything queued; it fails once the
// connection failed. A write error closes the connection, which wakes
// the reader: the reader reports the loss.
func (c *Conn) WritePacket(p []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	c.buf = append(c.buf, p...)
	if c.writing {
		return nil
	}
	c.writing = true
	for len(c.buf) > 0 && c.err == nil {
		b := c.buf
		c.buf, c.spare = c.spare[:0], nil
		c.mu.Unlock()
		_, err := c.w.Write(b)
		c.mu.Lock()
		if cap(b) <= 4*bufSize {
			c.spare = b[:0]
		}
		if err != nil && c.err == nil {
			c.err = err
			_ = c.Conn.Close()
		}
	}
	c.writing = false
	c.idle.Broadcast()
	return c.err
}

// Close writes what is queued (a final DISCONNECT, say) for at most a
// second and closes the connection; safe to call twice.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	_ = c.Conn.SetWriteDeadline(time.Now().Add(time.Second))
	for c.writing {
		c.idle.Wait()
	}
	rest := c.buf
	failed := c.err != nil
	c.err = net.ErrClosed
	c.buf = nil
	c.mu.Unlock()
	if len(rest) > 0 && !failed {
		_, _ = c.w.Write(rest)
	}
	err := c.Conn.Close()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
