package lab

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/etcdstore"
	"github.com/myriarch/myriarch/lease/etcdtest"
	"github.com/myriarch/myriarch/lease/pgstore"
	"github.com/myriarch/myriarch/lease/sqlitestore"
)

// Lease stores the lab runs on.
const (
	StoreSQLite   = "sqlite"
	StorePostgres = "postgres"
	StoreEtcd     = "etcd"
)

// Stores lists the stores in the order CI runs them.
var Stores = []string{StoreSQLite, StorePostgres, StoreEtcd}

// leaseID is the lease of the lab's exclusive session ("<bridge id>/<session id>").
const leaseID = "lab/plant"

// storeEnv is the lease store of one lab run: a real server (or file)
// that the bridge processes reach through a proxy each, and a reader of
// the lab's own that records the store's history.
type storeEnv struct {
	kind string
	// target is the server's host:port; "" for sqlite, which has no path
	// that a proxy could cut.
	target string
	// block renders the stores.lease block for an instance that reaches
	// the server at addr (the instance's proxy).
	block  func(addr string) string
	reader lease.Store
	closer []func()
}

func (s *storeEnv) Close() {
	if s.reader != nil {
		_ = s.reader.Close()
	}
	for i := len(s.closer) - 1; i >= 0; i-- {
		s.closer[i]()
	}
}

// Partitionable reports whether the owner's path to the store can be cut
// alone. A sqlite lease store is a file that every process on the host
// opens directly: there is no path to cut.
func (s *storeEnv) Partitionable() bool { return s.target != "" }

func startStore(ctx context.Context, kind, dir string) (*storeEnv, error) {
	return startStoreWith(ctx, kind, dir, nil)
}

// startStoreWith is startStore with extra server settings for a
// postgres store (pgtest.Options.Settings; fsync is off unless they set
// it on).
func startStoreWith(ctx context.Context, kind, dir string, pgSettings map[string]string) (*storeEnv, error) {
	s := &storeEnv{kind: kind}
	var err error
	switch kind {
	case StoreSQLite:
		path := filepath.Join(dir, "lease.db")
		s.block = func(string) string { return fmt.Sprintf("{type: sqlite, path: %q}", path) }
		s.reader, err = sqlitestore.Open(ctx, path, sqlitestore.Options{})
	case StorePostgres:
		var pg *pgtest.Cluster
		pg, err = pgtest.Start(ctx, pgtest.Options{Settings: pgSettings})
		if err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		s.closer = append(s.closer, func() {
			// The server's log stays with the run's other logs.
			if b, err := os.ReadFile(filepath.Join(pg.Dir(), "server.log")); err == nil {
				_ = os.WriteFile(filepath.Join(dir, "postgres.log"), b, 0o644)
			}
			_ = pg.Close()
		})
		s.target = net.JoinHostPort(pg.Host, fmt.Sprint(pg.Port))
		s.block = func(addr string) string {
			return fmt.Sprintf("{type: postgres, dsn: %q}", "postgres://postgres@"+addr+"/postgres?sslmode=disable&connect_timeout=2")
		}
		s.reader, err = pgstore.OpenDSN(ctx, pg.DSN(""), pgstore.Options{})
	case StoreEtcd:
		var endpoint string
		var stop func()
		endpoint, stop, err = startEtcd(dir)
		if err != nil {
			return nil, fmt.Errorf("etcd: %w", err)
		}
		s.closer = append(s.closer, stop)
		u, _ := url.Parse(endpoint)
		s.target = u.Host
		s.block = func(addr string) string {
			return fmt.Sprintf("{type: etcd, endpoints: [%q], prefix: /lab/}", "http://"+addr)
		}
		var cli *clientv3.Client
		cli, err = clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err == nil {
			s.closer = append(s.closer, func() { _ = cli.Close() })
			s.reader = etcdstore.Open(cli, etcdstore.Options{Prefix: "/lab/"})
		}
	default:
		return nil, fmt.Errorf("store %q: must be sqlite, postgres or etcd", kind)
	}
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("%s: %w", kind, err)
	}
	return s, nil
}

// startEtcd runs an embedded single-member etcd on free loopback ports.
func startEtcd(dir string) (string, func(), error) {
	s, err := etcdtest.StartIn(dir, "lab")
	if err != nil {
		return "", nil, err
	}
	return s.Endpoint, s.Stop, nil
}

// change is one transition of the lease row as the lab's reader saw it.
type change struct {
	At      time.Time
	Owner   string
	Version int64
	// RenewedAt is the owner's own renew record: for the first
	// transition of a version, its grant in the owner's wall clock (the
	// same host's clock in the lab), more exact than At, which is up to
	// one poll late.
	RenewedAt time.Time
}

// history polls the lease row and keeps every transition, so that what
// the store granted can be compared with what the sink received.
type history struct {
	mu      sync.Mutex
	changes []change
	errs    int
}

func (h *history) run(ctx context.Context, st lease.Store, every time.Duration) {
	var last change
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		r, err := st.Current(cctx, leaseID)
		cancel()
		now := time.Now()
		h.mu.Lock()
		if err != nil {
			if ctx.Err() == nil {
				h.errs++
			}
		} else if r.Owner != last.Owner || r.Version != last.Version {
			last = change{At: now, Owner: r.Owner, Version: r.Version, RenewedAt: r.RenewedAt}
			h.changes = append(h.changes, last)
		}
		h.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

func (h *history) snapshot() []change {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]change(nil), h.changes...)
}

// firstAfter is the first grant of a version above v, seen after t.
func (h *history) firstAfter(v int64) (change, bool) {
	for _, c := range h.snapshot() {
		if c.Version > v && c.Owner != "" {
			return c, true
		}
	}
	return change{}, false
}

// grantedAt is when version v's owner was granted the lease: its renew
// record if that lies within the poll before the lab saw the grant, else
// the time the lab saw it.
func (c change) grantedAt(every time.Duration) time.Time {
	if !c.RenewedAt.IsZero() && !c.RenewedAt.After(c.At) && c.At.Sub(c.RenewedAt) <= every+time.Second {
		return c.RenewedAt
	}
	return c.At
}

// releasedAt is when the poller saw lease version v released (no owner).
func (h *history) releasedAt(v int64) (time.Time, bool) {
	for _, c := range h.snapshot() {
		if c.Version == v && c.Owner == "" {
			return c.At, true
		}
	}
	return time.Time{}, false
}

// anomalies are transitions that would mean two owners at once: a version
// that goes down, or one version held by two different owners.
func anomalies(changes []change) []string {
	var out []string
	holder := map[int64]string{}
	var maxV int64
	for _, c := range changes {
		if c.Version < maxV {
			out = append(out, fmt.Sprintf("version went back from %d to %d (owner %q)", maxV, c.Version, c.Owner))
		}
		maxV = max(maxV, c.Version)
		if c.Owner == "" {
			continue
		}
		if h, ok := holder[c.Version]; ok && h != c.Owner {
			out = append(out, fmt.Sprintf("version %d held by %q and %q", c.Version, h, c.Owner))
		}
		holder[c.Version] = c.Owner
	}
	return out
}
