package anchorlab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/pgstore"
	"github.com/myriarch/myriarch/pgleader"
)

// envCandidate carries the CandidateSpec of a candidate subprocess.
const envCandidate = "MYRIARCH_ANCHORLAB_CANDIDATE"

// CandidateSpec configures one candidate subprocess.
type CandidateSpec struct {
	System string `json:"system"`
	ID     string `json:"id"`
	Run    string `json:"run"`
	Sink   string `json:"sink"`
	// Store: a PostgreSQL DSN or an etcd endpoint.
	Store string `json:"store"`
	// Key: the advisory lock key, pgleader's lock key, the election prefix
	// or the lease session are derived from it.
	Key int64 `json:"key"`
	// TTLMillis: etcd session TTL, lease TTL or pgleader's T.
	TTLMillis int64 `json:"ttl_ms"`
	// PollMillis: the naive lock's poll interval.
	PollMillis int64 `json:"poll_ms"`
	// WorkMillis: each round of the job works this long between deciding
	// to act (as leader) and the write; the check the system offers runs
	// right before the write.
	WorkMillis int64 `json:"work_ms"`
}

// MaybeRunCandidate runs the candidate subprocess and exits when this
// process was started as one; otherwise it returns at once. Call it first
// in main (or TestMain).
// The namespaced etcd of the netns-drop fault runs the same way.
func MaybeRunCandidate() {
	maybeRunEtcd()
	v := os.Getenv(envCandidate)
	if v == "" {
		return
	}
	var spec CandidateSpec
	if err := json.Unmarshal([]byte(v), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "anchorlab candidate:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	c := &candidate{spec: spec, http: &http.Client{Timeout: 5 * time.Second},
		log: slog.New(slog.NewTextHandler(os.Stderr, nil)).With("candidate", spec.ID, "system", spec.System)}
	var err error
	switch spec.System {
	case SystemEtcd:
		err = c.etcdElection(ctx)
	case SystemPGAdvisory, SystemPGAdvisoryKA:
		err = c.pgAdvisory(ctx)
	case SystemLease:
		err = c.lease(ctx)
	case SystemPGLeader:
		err = c.pgleader(ctx)
	default:
		err = fmt.Errorf("unknown system %q", spec.System)
	}
	if err != nil && ctx.Err() == nil {
		c.log.Error("candidate ended", "error", err)
		os.Exit(1)
	}
	os.Exit(0)
}

type candidate struct {
	spec CandidateSpec
	http *http.Client
	log  *slog.Logger
	seq  atomic.Int64
}

func (c *candidate) work() time.Duration { return time.Duration(c.spec.WorkMillis) * time.Millisecond }

func (c *candidate) ttl() time.Duration { return time.Duration(c.spec.TTLMillis) * time.Millisecond }

// post sends one record to the sink; a 409 (stale token) is errStale.
func (c *candidate) post(kind string, token, seq int64) error {
	q := url.Values{"run": {c.spec.Run}, "writer": {c.spec.ID}, "token": {strconv.FormatInt(token, 10)}, "seq": {strconv.FormatInt(seq, 10)}}
	resp, err := c.http.Post(c.spec.Sink+"/"+kind+"?"+q.Encode(), "text/plain", nil)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNoContent:
		return nil
	case http.StatusConflict:
		return errStale
	default:
		return fmt.Errorf("sink: %s", resp.Status)
	}
}

var errStale = errors.New("rejected by the resource: stale fencing token")

// act is one round of the job: the write to the fenced resource, then the
// next message of the stream. A write the resource refuses does not stop
// the message: the stream checks nothing.
func (c *candidate) act(token int64) {
	seq := c.seq.Add(1)
	if err := c.post(KindWrite, token, seq); err != nil && !errors.Is(err, errStale) {
		c.log.Warn("write", "error", err)
	}
	if err := c.post(KindMsg, 0, seq); err != nil {
		c.log.Warn("message", "error", err)
	}
}

func (c *candidate) hello() {
	for i := 0; i < 50; i++ {
		if c.post(KindHello, 0, 0) == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// etcdElection: client/v3/concurrency as its documentation shows it. The
// leader works until its session's Done channel closes; it presents the
// election key's create revision (Election.Rev) as its token.
func (c *candidate) etcdElection(ctx context.Context) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.spec.Store}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	prefix := fmt.Sprintf("/anchorlab/%d", c.spec.Key)
	ttl := max(1, int(c.ttl()/time.Second))
	c.hello()
	for ctx.Err() == nil {
		sess, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
		if err != nil {
			c.log.Warn("session", "error", err)
			time.Sleep(time.Second)
			continue
		}
		e := concurrency.NewElection(sess, prefix)
		if err := e.Campaign(ctx, c.spec.ID); err != nil {
			sess.Close()
			continue
		}
		rev := e.Rev()
		c.log.Info("elected", "rev", rev)
	lead:
		for {
			select {
			case <-ctx.Done():
				break lead
			case <-sess.Done():
				break lead
			case <-time.After(c.work()):
			}
			select {
			case <-sess.Done():
				break lead
			default:
			}
			c.act(rev)
		}
		c.log.Info("session done")
		sess.Close()
	}
	return nil
}

// pgAdvisory: the advisory-lock leader as people write it. One connection,
// no keepalive or timeout settings; pg_try_advisory_lock every PollMillis
// while following, a liveness query at the same rate while leading; the
// job works while the flag says it leads. No token.
func (c *candidate) pgAdvisory(ctx context.Context) error {
	var leading atomic.Bool
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		for ctx.Err() == nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(c.work()):
			}
			if leading.Load() {
				c.act(0)
			}
		}
	})
	poll := time.Duration(c.spec.PollMillis) * time.Millisecond
	c.hello()
	for ctx.Err() == nil {
		conn, err := pgx.Connect(ctx, c.spec.Store)
		if err != nil {
			c.log.Warn("connect", "error", err)
			time.Sleep(poll)
			continue
		}
		if c.spec.System == SystemPGAdvisoryKA {
			// The server probes an idle lock session after 2s and drops
			// it after 3 unanswered probes a second apart, or when data it
			// sent stays unacknowledged for 5s.
			for _, set := range []string{"SET tcp_keepalives_idle = 2", "SET tcp_keepalives_interval = 1", "SET tcp_keepalives_count = 3", "SET tcp_user_timeout = 5000"} {
				if _, err = conn.Exec(ctx, set); err != nil {
					break
				}
			}
			if err != nil {
				c.log.Warn("keepalive settings", "error", err)
				conn.Close(context.Background())
				continue
			}
		}
		for ctx.Err() == nil {
			if leading.Load() {
				_, err = conn.Exec(ctx, "SELECT 1")
			} else {
				var got bool
				err = conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", c.spec.Key).Scan(&got)
				if err == nil && got {
					c.log.Info("elected")
					leading.Store(true)
				}
			}
			if err != nil {
				c.log.Warn("lock connection", "error", err)
				leading.Store(false)
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(poll):
			}
		}
		conn.Close(context.Background())
	}
	return nil
}

// lease: Myriarch's lease.Manager on its PostgreSQL store. The job checks
// Ownership.Valid right before each write and presents the fencing
// version.
func (c *candidate) lease(ctx context.Context) error {
	store, err := pgstore.OpenDSN(ctx, c.spec.Store, pgstore.Options{})
	if err != nil {
		return err
	}
	defer store.Close()
	ttl := c.ttl()
	cadence, _, err := failover.ResolveCadence(failover.LeaseConfig{
		LeaseTTL: ttl, RenewInterval: ttl / 5, RenewCallTimeout: ttl / 10,
		AcquirePollInterval: 250 * time.Millisecond, StepDownGrace: time.Second,
	})
	if err != nil {
		return err
	}
	m, err := lease.New(lease.Config{
		Store:      store,
		Session:    fmt.Sprintf("anchorlab-%d", c.spec.Key),
		InstanceID: c.spec.ID,
		Cadence:    cadence,
		Registerer: prometheus.NewRegistry(),
		Logger:     c.log,
		OnOwner: func(own *lease.Ownership) {
			tok := own.Token().Version
			c.log.Info("owner", "version", tok)
			for {
				select {
				case <-own.Stopping():
					return
				case <-own.Context().Done():
					return
				case <-time.After(c.work()):
				}
				if !own.Valid() {
					_ = c.post(KindRefused, tok, c.seq.Add(1))
					continue
				}
				c.act(tok)
			}
		},
	})
	if err != nil {
		return err
	}
	c.hello()
	return m.Run(ctx)
}

// pgleader: myriarchd's leader election. The job runs under the term's
// context and writes through Leadership.InTerm; the term is its token.
// Inside InTerm the term row is locked FOR SHARE, so no newer term can
// start while the write is in flight.
func (c *candidate) pgleader(ctx context.Context) error {
	cfg, err := pgxpool.ParseConfig(c.spec.Store)
	if err != nil {
		return err
	}
	cfg.MaxConns = 6
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pgleader.EnsureSchema(ctx, pool); err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	e, err := pgleader.New(pgleader.Config{
		Pool:                 pool,
		LeaderSessionTimeout: c.ttl(),
		LockKey:              c.spec.Key,
		ID:                   c.spec.ID,
		Version:              "anchorlab",
		Logger:               c.log,
		OnElected: func(l *pgleader.Leadership) {
			term := l.Term()
			c.log.Info("elected", "term", term)
			wg.Go(func() {
				lctx := l.Context()
				for {
					select {
					case <-lctx.Done():
						return
					case <-time.After(c.work()):
					}
					err := l.InTerm(ctx, func(context.Context, pgx.Tx) error {
						c.act(term)
						return nil
					})
					if errors.Is(err, pgleader.ErrStaleTerm) {
						_ = c.post(KindRefused, term, c.seq.Add(1))
					}
				}
			})
		},
	})
	if err != nil {
		return err
	}
	c.hello()
	return e.Run(ctx)
}
