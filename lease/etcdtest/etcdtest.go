// Package etcdtest runs an embedded single-member etcd on free loopback
// ports, for the tests of the etcd lease store and for labs, and can stop
// and restart it on the same ports and data. It is the one embedded-etcd
// starter of the module: production binaries never link it.
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Server is an embedded etcd.
type Server struct {
	cfg *embed.Config
	// Endpoint is the client URL.
	Endpoint string

	mu sync.Mutex
	e  *embed.Etcd
}

// pickURL is freeURL; a test makes it hand out a port in use.
var pickURL = freeURL

func freeURL() (url.URL, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return url.URL{}, err
	}
	defer l.Close()
	return url.URL{Scheme: "http", Host: l.Addr().String()}, nil
}

// Start starts an etcd for t and stops it at the end of the test.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := StartIn(t.TempDir(), "lease-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartIn starts an etcd named name with its data below dir; the caller
// stops it.
//
// Its ports are found free and bound by etcd a moment later; another
// process (an outgoing connection's local port, another package's test)
// can take one in between. Then it starts afresh on other ports.
func StartIn(dir, name string) (*Server, error) {
	for attempt := 1; ; attempt++ {
		cfg := embed.NewConfig()
		cfg.Name = name
		cfg.Dir = filepath.Join(dir, fmt.Sprintf("etcd-%d", attempt))
		if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
			return nil, err
		}
		client, err := pickURL()
		if err != nil {
			return nil, err
		}
		peer, err := pickURL()
		if err != nil {
			return nil, err
		}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
		cfg.InitialCluster = fmt.Sprintf("%s=%s", cfg.Name, peer.String())
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		s := &Server{cfg: cfg, Endpoint: client.String()}
		err = s.start(1)
		if err == nil {
			return s, nil
		}
		if attempt == 5 || !strings.Contains(err.Error(), "address already in use") {
			return nil, err
		}
	}
}

// Restart starts the server again after Stop (same ports, same data).
func (s *Server) Restart() error {
	return s.start(50) // the ports may linger briefly after a stop
}

func (s *Server) start(tries int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.e != nil {
		return nil
	}
	var err error
	for try := range tries {
		if try > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		var e *embed.Etcd
		e, err = embed.StartEtcd(s.cfg)
		if err == nil {
			select {
			case <-e.Server.ReadyNotify():
				s.e = e
				return nil
			case <-time.After(30 * time.Second):
				e.Close()
				return fmt.Errorf("etcdtest: not ready after 30s")
			}
		}
	}
	return fmt.Errorf("etcdtest: start: %w", err)
}

// Stop stops the server, keeping its data.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.e != nil {
		s.e.Close()
		s.e = nil
	}
}

// Client returns a client of the server, closed at the end of the test.
func (s *Server) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
