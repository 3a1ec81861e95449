// Package embroker runs an embedded mochi-mqtt broker on loopback for the
// lab command and the tests. mochi's TCP listener does not report the port
// it bound for ":0", so Start picks a free port first.
package embroker

import (
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
)

// Broker is a running embedded broker.
type Broker struct {
	Server *mochi.Server
	Addr   string // host:port
	URL    string // tcp://host:port

	gate *takeoverGate
}

// FreePort returns a loopback address with a port that was free a moment ago.
func FreePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Start starts a broker that allows every client, with generous in-flight
// limits so that it is not the bottleneck of a measurement. addr "" picks
// a free port.
func Start(addr string, logger *slog.Logger) (*Broker, error) {
	return StartWith(addr, logger, Options{})
}

// Options are the embedded broker's optional TLS listener and users.
type Options struct {
	// TLS, if set, makes the listener TLS (mutual with ClientAuth set);
	// the URL is then mqtts://.
	TLS *tls.Config
	// Users, if set, are the only username/password pairs allowed.
	Users map[string]string
}

// StartWith is Start with Options.
func StartWith(addr string, logger *slog.Logger, opts Options) (*Broker, error) {
	// The broker serves on a listener bound here; for addr "" on a port
	// the kernel picked, rather than on a port found free a moment earlier
	// and bound again later, which another process (an outgoing
	// connection's local port, another package's test) can take in
	// between.
	bind := addr
	if bind == "" {
		bind = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, fmt.Errorf("embedded broker on %s: %w", bind, err)
	}
	if addr == "" {
		addr = ln.Addr().String()
	}
	if opts.TLS != nil {
		ln = tls.NewListener(ln, opts.TLS)
	}
	started := false
	defer func() {
		if !started {
			_ = ln.Close()
		}
	}()
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	caps := mochi.NewDefaultServerCapabilities()
	caps.ReceiveMaximum = 65535
	caps.MaximumInflight = 65535
	caps.MaximumClientWritesPending = 65536
	// No expiry for messages published without one (mochi's default adds
	// a day, which mosquitto does not): the bridge carries expiry through.
	caps.MaximumMessageExpiryInterval = 0
	s := mochi.New(&mochi.Options{Capabilities: caps, Logger: logger, InlineClient: true})
	if opts.Users == nil {
		if err := s.AddHook(new(auth.AllowHook), nil); err != nil {
			return nil, err
		}
	} else {
		l := &auth.Ledger{ACL: auth.ACLRules{{}}}
		for u, pw := range opts.Users {
			l.Auth = append(l.Auth, auth.AuthRule{Username: auth.RString(u), Password: auth.RString(pw), Allow: true})
		}
		if err := s.AddHook(new(auth.Hook), &auth.Options{Ledger: l}); err != nil {
			return nil, err
		}
	}
	gate := &takeoverGate{server: s}
	if err := s.AddHook(gate, nil); err != nil {
		return nil, err
	}
	if err := s.AddHook(&sendQuotaOff{}, nil); err != nil {
		return nil, err
	}
	if err := s.AddHook(&connectionLog{log: logger.With("component", "embroker")}, nil); err != nil {
		return nil, err
	}
	if err := s.AddHook(newDropLog(logger.With("component", "embroker")), nil); err != nil {
		return nil, err
	}
	if err := s.AddListener(newListener("tcp", ln)); err != nil {
		return nil, err
	}
	if err := s.Serve(); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("embedded broker on %s: %w", addr, err)
	}
	started = true
	scheme := "tcp://"
	if opts.TLS != nil {
		scheme = "mqtts://"
	}
	return &Broker{Server: s, Addr: addr, URL: scheme + addr, gate: gate}, nil
}

// Close stops the broker.
func (b *Broker) Close() error { return b.Server.Close() }
