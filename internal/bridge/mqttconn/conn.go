// Package mqttconn dials MQTT brokers for the bridge's transport and its
// MQTT sender and wraps the connection so that a forwarded message costs
// few system calls: reads go through a buffer, and writes are coalesced by
// one flusher goroutine, so that a burst of PUBLISH or PUBACK packets
// leaves in one write instead of one per packet (paho.golang writes every
// packet, and every part of a packet, with its own call).
package mqttconn

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"sync"
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
		td := tls.Dialer{NetDialer: &d, Config: cfg}
		c, err = td.DialContext(ctx, "tcp", u.Host)
	default:
		return nil, fmt.Errorf("broker %q: unsupported scheme %q", broker, u.Scheme)
	}
	if err != nil {
		return nil, err
	}
	return Wrap(c), nil
}

// Conn is a net.Conn with buffered reads and coalesced writes. It
// implements sync.Locker so that paho writes each packet's parts as one
// unit even when several goroutines write.
type Conn struct {
	net.Conn
	r       *bufio.Reader
	scratch []byte // ReadPacket's body of packets other than PUBLISH

	packet sync.Mutex // held across the parts of one packet (sync.Locker)

	mu      sync.Mutex
	buf     []byte
	spare   []byte
	err     error
	closed  bool
	kick    chan struct{}
	stop    chan struct{}
	flushed chan struct{}
}

const bufSize = 64 << 10

// Wrap wraps c and starts its flusher, which Close stops.
func Wrap(c net.Conn) *Conn {
	w := &Conn{Conn: c, r: bufio.NewReaderSize(c, bufSize), kick: make(chan struct{}, 1),
		stop: make(chan struct{}), flushed: make(chan struct{}),
		buf: make([]byte, 0, bufSize), spare: make([]byte, 0, bufSize)}
	go w.flusher()
	return w
}

// Lock and Unlock make the parts of one packet contiguous.
func (c *Conn) Lock()   { c.packet.Lock() }
func (c *Conn) Unlock() { c.packet.Unlock() }

func (c *Conn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Write queues p for the flusher; it fails once the connection failed.
func (c *Conn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, err
	}
	c.buf = append(c.buf, p...)
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (c *Conn) flusher() {
	defer close(c.flushed)
	for {
		select {
		case <-c.stop:
			return
		case <-c.kick:
		}
		for {
			c.mu.Lock()
			b := c.buf
			c.buf, c.spare = c.spare[:0], nil
			c.mu.Unlock()
			if len(b) == 0 {
				c.mu.Lock()
				c.spare = b
				c.mu.Unlock()
				break
			}
			_, err := c.Conn.Write(b)
			c.mu.Lock()
			if len(b) <= 4*bufSize {
				c.spare = b[:0]
			} else {
				c.spare = make([]byte, 0, bufSize)
			}
			if err != nil && c.err == nil {
				c.err = err
			}
			c.mu.Unlock()
			if err != nil {
				_ = c.Conn.Close() // wakes the reader, which reports the loss
				return
			}
		}
	}
}

// Close writes what is queued (a final DISCONNECT, say) for at most a
// second, closes the connection and stops the flusher; safe to call twice.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	_ = c.Conn.SetWriteDeadline(time.Now().Add(time.Second))
	close(c.stop)
	<-c.flushed
	c.mu.Lock()
	rest := c.buf
	failed := c.err != nil
	c.err = net.ErrClosed
	c.buf = nil
	c.mu.Unlock()
	if len(rest) > 0 && !failed {
		_, _ = c.Conn.Write(rest)
	}
	err := c.Conn.Close()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
