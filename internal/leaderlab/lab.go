// Package leaderlab runs the failover scenarios of pgleader against a
// throwaway PostgreSQL and measures them: a frozen lock-session connection,
// a network that drops every packet between the leader and the server
// (network namespaces), a frozen leader process (SIGSTOP), kill -9, a
// crash and a planned stop. The replicas are subprocesses (this binary,
// re-executed; see MaybeRunReplica). `myriarch-lab leader` and the tests
// of this package share it.
package leaderlab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/pgleader"
)

// Scenario names.
const (
	ScenarioFreeze      = "lock-session-freeze"
	ScenarioNetworkDrop = "network-drop"
	ScenarioSigstop     = "sigstop"
	ScenarioKill9       = "kill-9"
	ScenarioCrash       = "crash"
	ScenarioPlannedStop = "planned-stop"
)

// Scenarios lists every scenario in the order Run runs them.
var Scenarios = []string{ScenarioFreeze, ScenarioNetworkDrop, ScenarioSigstop, ScenarioKill9, ScenarioCrash, ScenarioPlannedStop}

// Result is one scenario's measurement (one JSON line of failover-lab).
type Result struct {
	Scenario              string  `json:"scenario"`
	LeaderSessionTimeoutS float64 `json:"leader_session_timeout_s"`
	// MeasuredFailoverS is the time from the fault to the moment the new
	// leader had started its term.
	MeasuredFailoverS float64 `json:"measured_failover_s"`
	BoundS            float64 `json:"bound_s"`
	// OverlapDetected: a fenced write of an older term committed after one
	// of a newer term, the old leader committed a write after the new one
	// was elected, or (where it keeps running) it stopped acting only after
	// the new leader started.
	OverlapDetected bool `json:"overlap_detected"`
	// OldLeaderStoppedS is the time from the fault to the old leader's
	// demotion, where the old process can notice it.
	OldLeaderStoppedS *float64 `json:"old_leader_stopped_s,omitempty"`
	// ServerDropS (network-drop) is the time from the last packet the
	// server received from the leader's lock session until the server
	// dropped it; EarliestDropS and LatestDropS are the derived window
	// D − I and D.
	ServerDropS   *float64 `json:"server_drop_s,omitempty"`
	EarliestDropS *float64 `json:"earliest_drop_s,omitempty"`
	LatestDropS   *float64 `json:"latest_drop_s,omitempty"`
	// StaleWritesCommitted counts writes of the old leader committed after
	// the new leader was elected (must be 0); StaleWritesRejected counts the
	// rejections the fence reported to it.
	StaleWritesCommitted int `json:"stale_writes_committed"`
	StaleWritesRejected  int `json:"stale_writes_rejected"`
	// Skipped names why a scenario did not run.
	Skipped string `json:"skipped,omitempty"`
}

// WithinBound reports whether the measured failover is within the bound.
func (r Result) WithinBound() bool { return r.MeasuredFailoverS <= r.BoundS }

// Options configure a lab.
type Options struct {
	// T is ha.leaderSessionTimeout; default 10s.
	T time.Duration
	// Exe is the binary to re-execute as a replica; default this one. It
	// must call MaybeRunReplica first.
	Exe string
	// Log receives progress lines; nil discards them.
	Log func(format string, args ...any)
	// ReplicaLog receives the replicas' stderr; nil discards it.
	ReplicaLog io.Writer
	// RequireNetns makes network-drop fail instead of reporting Skipped
	// when namespaces cannot be created.
	RequireNetns bool
	// Jitter, when set, replaces the random part of the follower's settle
	// time before a fault (within [0, max)): a seeded campaign's timing.
	Jitter func(max time.Duration) time.Duration
}

// Lab holds the loopback cluster shared by the scenarios that need no
// network namespaces.
type Lab struct {
	opts    Options
	k       failover.LeaderKeepalive
	cluster *pgtest.Cluster
	keySeq  atomic.Int64
}

// New starts the loopback cluster. Close it.
func New(ctx context.Context, opts Options) (*Lab, error) {
	if opts.T == 0 {
		opts.T = 10 * time.Second
	}
	k, err := failover.DeriveLeaderKeepalive(opts.T)
	if err != nil {
		return nil, err
	}
	if opts.Exe == "" {
		if opts.Exe, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	if opts.ReplicaLog == nil {
		opts.ReplicaLog = io.Discard
	}
	c, err := pgtest.Start(ctx, pgtest.Options{Log: opts.Log, Settings: labSettings})
	if err != nil {
		return nil, err
	}
	l := &Lab{opts: opts, k: k, cluster: c}
	l.keySeq.Store(pgleader.DefaultLockKey)
	return l, nil
}

// labSettings: commit timestamps let the lab order the fenced writes by
// the server's commit time.
var labSettings = map[string]string{"track_commit_timestamp": "on"}

// Close stops the cluster.
func (l *Lab) Close() error { return l.cluster.Close() }

// Keepalive returns the derived parameters of the lab's T.
func (l *Lab) Keepalive() failover.LeaderKeepalive { return l.k }

// Run runs one scenario.
func (l *Lab) Run(ctx context.Context, scenario string) (Result, error) {
	r := Result{Scenario: scenario, LeaderSessionTimeoutS: l.k.T.Seconds()}
	var err error
	switch scenario {
	case ScenarioFreeze:
		r.BoundS = pgleader.HardFailureBound(l.k).Seconds()
		err = l.freeze(ctx, &r)
	case ScenarioNetworkDrop:
		r.BoundS = pgleader.HardFailureBound(l.k).Seconds()
		err = l.networkDrop(ctx, &r)
	case ScenarioSigstop:
		r.BoundS = pgleader.FrozenLeaderBound(l.k).Seconds()
		err = l.simple(ctx, &r, l.sigstop)
	case ScenarioKill9:
		r.BoundS = pgleader.CleanCloseBound(l.k).Seconds()
		err = l.simple(ctx, &r, func(_ context.Context, a *proc) (time.Time, error) {
			t0 := time.Now()
			return t0, a.signal(syscall.SIGKILL)
		})
	case ScenarioCrash:
		r.BoundS = pgleader.CleanCloseBound(l.k).Seconds()
		err = l.simple(ctx, &r, func(_ context.Context, a *proc) (time.Time, error) {
			t0 := time.Now()
			return t0, a.send("crash")
		})
	case ScenarioPlannedStop:
		r.BoundS = pgleader.PlannedStopBound(l.k).Seconds()
		err = l.simple(ctx, &r, func(_ context.Context, a *proc) (time.Time, error) {
			t0 := time.Now()
			return t0, a.signal(syscall.SIGTERM)
		})
	default:
		return r, fmt.Errorf("leaderlab: unknown scenario %q (known: %s)", scenario, strings.Join(Scenarios, ", "))
	}
	r.round()
	return r, err
}

// round keeps milliseconds, the resolution of the measurements.
func (r *Result) round() {
	ms := func(v float64) float64 { return math.Round(v*1000) / 1000 }
	r.MeasuredFailoverS = ms(r.MeasuredFailoverS)
	r.BoundS = ms(r.BoundS)
	for _, p := range []*float64{r.OldLeaderStoppedS, r.ServerDropS, r.EarliestDropS, r.LatestDropS} {
		if p != nil {
			*p = ms(*p)
		}
	}
}

func (l *Lab) spec(id, poolDSN, sessionDSN string, key int64) ReplicaSpec {
	return ReplicaSpec{ID: id, PoolDSN: poolDSN, SessionDSN: sessionDSN, TMillis: l.k.T.Milliseconds(),
		HBMillis: pgleader.DefaultHeartbeatInterval.Milliseconds(), LockKey: key, WriteMS: 50}
}

// prepare creates the lab's writes table and the pgleader tables and
// returns a pool (on observer) for the checks.
func prepare(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, err
	}
	if err := pgleader.EnsureSchema(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	if _, err := pool.Exec(ctx, writesSchema); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// pair starts replica a, waits until it leads, then starts b as follower.
func (l *Lab) pair(ctx context.Context, wrapA, wrapB []string, specA, specB ReplicaSpec) (a, b *proc, electedA Event, err error) {
	a, err = startProc(l.opts.Exe, wrapA, specA, l.opts.ReplicaLog)
	if err != nil {
		return nil, nil, Event{}, err
	}
	electedA, err = a.wait(ctx, "elected", time.Time{}, 60*time.Second)
	if err != nil {
		a.kill()
		return nil, nil, Event{}, err
	}
	b, err = startProc(l.opts.Exe, wrapB, specB, l.opts.ReplicaLog)
	if err != nil {
		a.kill()
		return nil, nil, Event{}, err
	}
	if _, err = b.wait(ctx, "ready", time.Time{}, 60*time.Second); err != nil {
		a.kill()
		b.kill()
		return nil, nil, Event{}, err
	}
	// Let a write for a while and b settle into its follower loop; the
	// random part makes the fault fall at a random point of b's retry
	// cycle, so the handover times are a fair sample.
	jitter := rand.N(l.k.FollowerRetryMax)
	if l.opts.Jitter != nil {
		jitter = l.opts.Jitter(l.k.FollowerRetryMax)
	}
	time.Sleep(l.k.FollowerRetryMax + jitter)
	if len(a.eventsSince("write", time.Time{})) == 0 {
		a.kill()
		b.kill()
		return nil, nil, Event{}, errors.New("leaderlab: the leader made no fenced write")
	}
	return a, b, electedA, nil
}

// checkWrites looks for fenced writes out of term order and for writes of
// the old term committed after the new term began, by the commit
// timestamps of the server (track_commit_timestamp is on in the lab's
// clusters).
func checkWrites(ctx context.Context, pool *pgxpool.Pool, key, oldTerm, newTerm int64, r *Result) error {
	var outOfOrder int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT term, max(term) OVER (ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev
		FROM `+WritesTable+` WHERE lock_key = $1) s WHERE term < prev`, key).Scan(&outOfOrder); err != nil {
		return err
	}
	termStart, err := pgleader.TermCommitTime(ctx, pool, key, newTerm)
	if err != nil {
		return fmt.Errorf("leaderlab: the commit time of term %d: %w", newTerm, err)
	}
	var newWrites, late int
	err = pool.QueryRow(ctx, `WITH start AS (
			SELECT least($4::timestamptz,
				(SELECT min(pg_xact_commit_timestamp(xmin)) FROM `+WritesTable+` WHERE lock_key = $1 AND term = $3)) AS at)
		SELECT (SELECT count(*) FROM `+WritesTable+` WHERE lock_key = $1 AND term = $3),
			(SELECT count(*) FROM `+WritesTable+` w, start WHERE w.lock_key = $1 AND w.term = $2 AND pg_xact_commit_timestamp(w.xmin) >= start.at)`,
		key, oldTerm, newTerm, termStart).Scan(&newWrites, &late)
	if err != nil {
		return err
	}
	if newWrites == 0 {
		return errors.New("leaderlab: the new leader made no fenced write")
	}
	r.StaleWritesCommitted += late
	if outOfOrder > 0 || late > 0 {
		r.OverlapDetected = true
	}
	return nil
}

// settle waits until the new leader wrote, then checks.
func (l *Lab) settle(ctx context.Context, pool *pgxpool.Pool, key int64, a, b *proc, ea, eb Event, r *Result) error {
	if _, err := b.wait(ctx, "write", eb.Time(), 10*time.Second); err != nil {
		return err
	}
	time.Sleep(300 * time.Millisecond)
	r.StaleWritesRejected = len(a.eventsSince("fenced", time.Time{}))
	if err := checkWrites(ctx, pool, key, ea.Term, eb.Term, r); err != nil {
		return err
	}
	if eb.Term <= ea.Term {
		return fmt.Errorf("leaderlab: term did not increase (%d after %d)", eb.Term, ea.Term)
	}
	return nil
}

func secs(d time.Duration) *float64 {
	v := d.Seconds()
	return &v
}

func (l *Lab) nextKey() int64 { return l.keySeq.Add(1) }

// freeze: the leader's lock session goes through a proxy that stops
// forwarding without FIN; everything else reaches the database.
func (l *Lab) freeze(ctx context.Context, r *Result) error {
	dsn := l.cluster.DSN("")
	pool, err := prepare(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	proxy, err := pgtest.NewProxy(net.JoinHostPort(l.cluster.Host, strconv.Itoa(l.cluster.Port)), "")
	if err != nil {
		return err
	}
	defer proxy.Close()
	host, port := proxy.HostPort()
	sessionDSN := fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", net.JoinHostPort(host, strconv.Itoa(port)))
	key := l.nextKey()
	a, b, ea, err := l.pair(ctx, nil, nil, l.spec(r.Scenario+"-a", dsn, sessionDSN, key), l.spec(r.Scenario+"-b", dsn, "", key))
	if err != nil {
		return err
	}
	defer a.kill()
	defer b.kill()
	t0 := time.Now()
	proxy.Freeze()
	l.opts.Log("leaderlab: %s: froze the lock session of the leader", r.Scenario)
	eb, err := b.wait(ctx, "elected", t0, 3*l.k.T)
	if err != nil {
		return err
	}
	r.MeasuredFailoverS = eb.Time().Sub(t0).Seconds()
	da, err := a.wait(ctx, "demoted", t0, 5*time.Second)
	if err != nil {
		return err
	}
	r.OldLeaderStoppedS = secs(da.Time().Sub(t0))
	if !da.Time().Before(eb.Time()) {
		r.OverlapDetected = true
	}
	return l.settle(ctx, pool, key, a, b, ea, eb, r)
}

// simple runs a pair on loopback and applies fault to the leader.
func (l *Lab) simple(ctx context.Context, r *Result, fault func(context.Context, *proc) (time.Time, error)) error {
	dsn := l.cluster.DSN("")
	pool, err := prepare(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	key := l.nextKey()
	a, b, ea, err := l.pair(ctx, nil, nil, l.spec(r.Scenario+"-a", dsn, "", key), l.spec(r.Scenario+"-b", dsn, "", key))
	if err != nil {
		return err
	}
	defer a.kill()
	defer b.kill()
	t0, err := fault(ctx, a)
	if err != nil {
		return err
	}
	l.opts.Log("leaderlab: %s: fault applied", r.Scenario)
	eb, err := b.wait(ctx, "elected", t0, 2*pgleader.FrozenLeaderBound(l.k))
	if err != nil {
		return err
	}
	r.MeasuredFailoverS = eb.Time().Sub(t0).Seconds()
	if r.Scenario == ScenarioPlannedStop {
		da, err := a.wait(ctx, "demoted", t0, 5*time.Second)
		if err != nil {
			return err
		}
		r.OldLeaderStoppedS = secs(da.Time().Sub(t0))
		if !da.Time().Before(eb.Time()) {
			r.OverlapDetected = true
		}
		if !a.waitExit(10 * time.Second) {
			return errors.New("leaderlab: the stopped leader did not exit")
		}
	}
	if r.Scenario == ScenarioSigstop {
		// Wake the frozen leader and give it time to act on its old term.
		tc := time.Now()
		if err := a.signal(syscall.SIGCONT); err != nil {
			return err
		}
		da, err := a.wait(ctx, "demoted", tc, 10*time.Second)
		if err != nil {
			return err
		}
		r.OldLeaderStoppedS = secs(da.Time().Sub(t0))
		if _, err := a.wait(ctx, "fenced", tc, 10*time.Second); err != nil {
			return fmt.Errorf("the woken leader's job was never rejected by the fence: %w", err)
		}
		time.Sleep(time.Second)
	}
	return l.settle(ctx, pool, key, a, b, ea, eb, r)
}

func (l *Lab) sigstop(_ context.Context, a *proc) (time.Time, error) {
	t0 := time.Now()
	return t0, a.signal(syscall.SIGSTOP)
}

// networkDrop: PostgreSQL in one namespace, the leader in a second, the
// follower in a third; then every packet between the leader and the
// server is dropped. The server notices only by its keepalives.
func (l *Lab) networkDrop(ctx context.Context, r *Result) error {
	n, err := SetupNetns(ctx)
	if errors.Is(err, ErrNoNetns) && !l.opts.RequireNetns {
		r.Skipped = err.Error()
		return nil
	}
	if err != nil {
		return err
	}
	defer n.Close()
	const port = 5432
	hba, err := os.MkdirTemp("", "leaderlab-hba-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(hba)
	// The replicas connect from the other namespaces' addresses; initdb's
	// pg_hba.conf trusts only loopback.
	if err := os.Chmod(hba, 0o755); err != nil {
		return err
	}
	hbaFile := filepath.Join(hba, "pg_hba.conf")
	if err := os.WriteFile(hbaFile, []byte("local all all trust\nhost all all 10.213.0.0/24 trust\n"), 0o644); err != nil {
		return err
	}
	settings := map[string]string{"hba_file": hbaFile}
	maps.Copy(settings, labSettings)
	c, err := pgtest.Start(ctx, pgtest.Options{ListenAddress: DBAddr, Port: port, Wrap: Wrap(n.DB), Log: l.opts.Log, Settings: settings})
	if err != nil {
		return err
	}
	defer c.Close()
	observer, err := prepare(ctx, c.SocketDSN(""))
	if err != nil {
		return err
	}
	defer observer.Close()
	dsn := c.DSN("")
	key := l.nextKey()
	a, b, ea, err := l.pair(ctx, Wrap(n.Leader), Wrap(n.Follower), l.spec(r.Scenario+"-a", dsn, "", key), l.spec(r.Scenario+"-b", dsn, "", key))
	if err != nil {
		return err
	}
	defer a.kill()
	defer b.kill()
	if ea.PID == 0 {
		return errors.New("leaderlab: the leader did not report its lock session pid")
	}
	var clientPort int
	if err := observer.QueryRow(ctx, "SELECT client_port FROM pg_stat_activity WHERE pid = $1", ea.PID).Scan(&clientPort); err != nil {
		return fmt.Errorf("leaderlab: lock session %d: %w", ea.PID, err)
	}

	t0 := time.Now()
	if err := DropBetween(ctx, n.Leader, DBAddr); err != nil {
		return err
	}
	l.opts.Log("leaderlab: %s: dropping all packets between %s and %s", r.Scenario, LeaderAddr, DBAddr)
	// The last packet the server's socket received from the lock session.
	time.Sleep(200 * time.Millisecond)
	lastPacket, err := LastReceived(ctx, n.DB, port, clientPort)
	if err != nil {
		return err
	}
	// When the server drops the session: poll pg_stat_activity over the
	// unix socket from the root namespace.
	var dropped time.Time
	deadline := time.Now().Add(3 * l.k.T)
	for time.Now().Before(deadline) {
		var alive bool
		before := time.Now()
		if err := observer.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", ea.PID).Scan(&alive); err != nil {
			return err
		}
		if !alive {
			// The session ended between the previous poll and this one.
			dropped = before
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	if dropped.IsZero() {
		return fmt.Errorf("leaderlab: the server did not drop the lock session within %v", 3*l.k.T)
	}
	r.ServerDropS = secs(dropped.Sub(lastPacket))
	r.EarliestDropS = secs(l.k.EarliestDrop)
	r.LatestDropS = secs(l.k.LatestDrop)
	eb, err := b.wait(ctx, "elected", t0, 3*l.k.T)
	if err != nil {
		return err
	}
	r.MeasuredFailoverS = eb.Time().Sub(t0).Seconds()
	da, err := a.wait(ctx, "demoted", t0, l.k.T)
	if err != nil {
		return err
	}
	r.OldLeaderStoppedS = secs(da.Time().Sub(t0))
	if !da.Time().Before(eb.Time()) {
		r.OverlapDetected = true
	}
	return l.settle(ctx, observer, key, a, b, ea, eb, r)
}
