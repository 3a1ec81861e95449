// Package anchorlab runs the same singleton workload under the leader
// elections people use instead of Myriarch ("the anchors") and under
// Myriarch's own, and applies the same faults to each: SIGSTOP of the
// leader past its TTL, every packet between the leader and its store
// dropped (network namespaces), kill -9. It measures the time to a new
// leader, the writes a deposed leader made after the new leader's first
// write, and whether the resource could tell (fencing token).
//
// The workload: a candidate subprocess (this binary, re-executed; see
// MaybeRunCandidate) that, while it believes it leads, works for a moment,
// runs the check its system offers, writes to a fenced resource and emits
// the next message of a stream. The resource and the stream are one HTTP
// sink in the lab process (Sink) that records every request with the
// writer's identity, the token it presents and the sink's receive time; a
// write whose token is lower than the highest the run has seen is
// rejected. `myriarch-lab anchors` and the tests of this package share it.
package anchorlab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/myriarch/myriarch/internal/leaderlab"
	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/lease/etcdtest"
)

// Systems (candidate implementations).
const (
	SystemEtcd       = "etcd-election"
	SystemPGAdvisory = "pg-advisory-lock"
	// SystemPGAdvisoryKA is the same lock with the server's TCP keepalives
	// and user timeout set on the lock session (idle 2s, interval 1s,
	// count 3, tcp_user_timeout 5s), what people add after the first
	// two-hour outage.
	SystemPGAdvisoryKA = "pg-advisory-lock+ka"
	SystemLease        = "myriarch-lease"
	SystemPGLeader     = "myriarch-pgleader"
	SystemClientGo     = "client-go-leaderelection"
)

// RowEtcdRev is the second row of an etcd-election run: the same writes as
// seen by a resource that checks the election key's create revision.
const RowEtcdRev = "etcd-election+rev"

// Systems lists the systems in the order the lab runs them.
var Systems = []string{SystemEtcd, SystemPGAdvisory, SystemPGAdvisoryKA, SystemLease, SystemPGLeader, SystemClientGo}

// ClientGoUnavailable is why client-go's leaderelection does not run here.
const ClientGoUnavailable = "no real Kubernetes API server on this machine: Debian has no kube-apiserver, " +
	"`go install k8s.io/kubernetes/cmd/kube-apiserver@v1.37.2` is refused (replace directives) and there is no Docker; " +
	"a fake clientset would not test the election against a real server"

// Faults.
const (
	FaultSigstop   = "sigstop"
	FaultNetnsDrop = "netns-drop"
	FaultKill9     = "kill-9"
)

// Faults lists the faults in the order the lab runs them.
var Faults = []string{FaultSigstop, FaultNetnsDrop, FaultKill9}

// SinkAddr is the sink's address inside the store namespace of the
// netns-drop fault: on the same bridge as the store, not dropped.
const SinkAddr = "10.213.0.9"

// Row is one run of one system under one fault (one JSON line).
type Row struct {
	System string `json:"system"`
	Fault  string `json:"fault"`
	Rep    int    `json:"rep"`
	// TTLS is the system's lease/session TTL (pgleader's T; the naive
	// lock's poll interval).
	TTLS float64 `json:"ttl_s"`
	// FaultS is how long the fault lasted before the old leader was woken
	// (sigstop) or how long the lab waited for a new leader.
	FaultS float64 `json:"fault_s"`
	// NewLeaderS: from the fault to the new leader's first accepted write
	// at the resource; null when no new leader wrote.
	NewLeaderS *float64 `json:"new_leader_s"`
	// DeposedWrites: writes of the old leader that reached the resource
	// after the new leader's first write; DeposedAccepted of them the
	// resource took, DeposedRejected it refused by their token.
	DeposedWrites   int `json:"deposed_writes"`
	DeposedAccepted int `json:"deposed_accepted"`
	DeposedRejected int `json:"deposed_rejected"`
	// DeposedLastS: the last of them, after the new leader's first write.
	DeposedLastS *float64 `json:"deposed_last_s"`
	// DeposedRefused: writes the old leader's own check stopped before
	// they left the process (lease validity, pgleader's term), after the
	// new leader's first write.
	DeposedRefused int `json:"deposed_refused"`
	// DeposedMsgs: stream messages of the old leader after the new
	// leader's first message (the stream checks no token).
	DeposedMsgs int `json:"deposed_msgs"`
	// OldLastS: from the fault to the last write of the old leader that
	// reached the resource (whatever the answer; null when none after the
	// fault). Under netns-drop it says how long a leader cut off from its
	// store kept acting.
	OldLastS *float64 `json:"old_last_s"`
	// Token: what the resource checked ("none", "create revision",
	// "fencing version", "term").
	Token   string `json:"token"`
	Skipped string `json:"skipped,omitempty"`
}

// Options configure a lab.
type Options struct {
	// EtcdTTL is the etcd session TTL (default 5s), LeaseTTL Myriarch's
	// lease TTL (5s), PGLeaderT pgleader's T (10s, its minimum), PGPoll the
	// naive lock's poll interval (2s).
	EtcdTTL, LeaseTTL, PGLeaderT, PGPoll time.Duration
	// Work is each job round's work before the check and the write (100ms).
	Work time.Duration
	// Stop is how long SIGSTOP lasts (20s: past every TTL and pgleader's
	// frozen-leader bound of 13.5s at T = 10s).
	Stop time.Duration
	// After is how long the lab keeps watching after SIGCONT, or after the
	// new leader's first write (5s).
	After time.Duration
	// Timeout is the longest wait for a new leader (40s).
	Timeout time.Duration
	// Exe is the binary to re-execute as a candidate; default this one.
	// It must call MaybeRunCandidate first.
	Exe string
	// Log receives progress lines; CandidateLog the candidates' stderr.
	Log          func(format string, args ...any)
	CandidateLog io.Writer
	// RequireNetns makes netns-drop fail instead of reporting Skipped.
	RequireNetns bool
}

func (o *Options) defaults() error {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&o.EtcdTTL, 5*time.Second)
	def(&o.LeaseTTL, 5*time.Second)
	def(&o.PGLeaderT, 10*time.Second)
	def(&o.PGPoll, 2*time.Second)
	def(&o.Work, 100*time.Millisecond)
	def(&o.Stop, 20*time.Second)
	def(&o.After, 5*time.Second)
	def(&o.Timeout, 40*time.Second)
	if o.EtcdTTL < time.Second || o.EtcdTTL%time.Second != 0 {
		return fmt.Errorf("anchorlab: etcd TTL %v: must be whole seconds, at least 1s", o.EtcdTTL)
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	if o.CandidateLog == nil {
		o.CandidateLog = io.Discard
	}
	if o.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		o.Exe = exe
	}
	return nil
}

// Lab holds the loopback stores and the sink.
type Lab struct {
	opts    Options
	sink    *Sink
	sinkURL string
	pg      *pgtest.Cluster
	etcd    *etcdtest.Server
	etcdDir string
	seq     atomic.Int64
}

// New starts a loopback PostgreSQL, an embedded etcd and the sink. Close it.
func New(ctx context.Context, opts Options) (*Lab, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	l := &Lab{opts: opts, sink: NewSink()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l.sinkURL, _ = l.sink.Listen(ln)
	if l.pg, err = pgtest.Start(ctx, pgtest.Options{Log: opts.Log}); err != nil {
		l.Close()
		return nil, err
	}
	if l.etcdDir, err = os.MkdirTemp("", "anchorlab-etcd-"); err != nil {
		l.Close()
		return nil, err
	}
	if l.etcd, err = etcdtest.StartIn(l.etcdDir, "anchorlab"); err != nil {
		l.Close()
		return nil, err
	}
	l.seq.Store(rand.Int64N(1 << 40)) // keys and prefixes of runs never collide with an earlier lab's leftovers
	return l, nil
}

// Close stops the stores and the sink.
func (l *Lab) Close() error {
	var errs []error
	if l.etcd != nil {
		l.etcd.Stop()
	}
	if l.etcdDir != "" {
		os.RemoveAll(l.etcdDir)
	}
	if l.pg != nil {
		errs = append(errs, l.pg.Close())
	}
	errs = append(errs, l.sink.Close())
	return errors.Join(errs...)
}

func (l *Lab) ttl(system string) time.Duration {
	switch system {
	case SystemEtcd:
		return l.opts.EtcdTTL
	case SystemLease:
		return l.opts.LeaseTTL
	case SystemPGLeader:
		return l.opts.PGLeaderT
	case SystemPGAdvisory, SystemPGAdvisoryKA:
		return l.opts.PGPoll
	}
	return 0
}

func tokenName(system string) string {
	switch system {
	case SystemEtcd:
		return "create revision"
	case SystemLease:
		return "fencing version"
	case SystemPGLeader:
		return "term"
	}
	return "none"
}

// env is where one run's candidates run and reach their store and the sink.
type env struct {
	store, sink  string
	wrapA, wrapB []string
	fault        func(a *proc) error // the netns drop
	cleanup      []func()
}

func (e *env) close() {
	for i := len(e.cleanup) - 1; i >= 0; i-- {
		e.cleanup[i]()
	}
}

// Run runs system under fault once. For etcd-election it returns two rows:
// the writes as a resource that ignores the token sees them, and as one
// that checks the create revision (RowEtcdRev).
func (l *Lab) Run(ctx context.Context, system, fault string, rep int) ([]Row, error) {
	r := Row{System: system, Fault: fault, Rep: rep, TTLS: l.ttl(system).Seconds(), Token: tokenName(system)}
	if system == SystemClientGo {
		r.Skipped = ClientGoUnavailable
		return []Row{r}, nil
	}
	if !contains(Systems, system) {
		return nil, fmt.Errorf("anchorlab: unknown system %q (known: %s)", system, strings.Join(Systems, ", "))
	}
	if !contains(Faults, fault) {
		return nil, fmt.Errorf("anchorlab: unknown fault %q (known: %s)", fault, strings.Join(Faults, ", "))
	}
	n := l.seq.Add(1)
	run := fmt.Sprintf("%s/%s/%d", system, fault, n)
	defer l.sink.Forget(run)
	var e *env
	var err error
	if fault == FaultNetnsDrop {
		e, err = l.netnsEnv(ctx, system)
		if errors.Is(err, leaderlab.ErrNoNetns) && !l.opts.RequireNetns {
			r.Skipped = err.Error()
			return []Row{r}, nil
		}
	} else {
		e, err = l.loopbackEnv(system)
	}
	if err != nil {
		return nil, err
	}
	defer e.close()
	spec := func(id string) CandidateSpec {
		return CandidateSpec{System: system, ID: id, Run: run, Sink: e.sink, Store: e.store, Key: n,
			TTLMillis: l.ttl(system).Milliseconds(), PollMillis: l.opts.PGPoll.Milliseconds(), WorkMillis: l.opts.Work.Milliseconds()}
	}
	idA, idB := "a", "b"
	a, err := startProc(l.opts.Exe, e.wrapA, spec(idA), l.opts.CandidateLog)
	if err != nil {
		return nil, err
	}
	defer a.kill()
	if _, ok := l.sink.Wait(ctx, run, 60*time.Second, func(x Record) bool { return x.Kind == KindWrite && x.Writer == idA }); !ok {
		return nil, fmt.Errorf("anchorlab: %s: candidate a made no write within 60s", run)
	}
	b, err := startProc(l.opts.Exe, e.wrapB, spec(idB), l.opts.CandidateLog)
	if err != nil {
		return nil, err
	}
	defer b.kill()
	if _, ok := l.sink.Wait(ctx, run, 60*time.Second, func(x Record) bool { return x.Kind == KindHello && x.Writer == idB }); !ok {
		return nil, fmt.Errorf("anchorlab: %s: candidate b did not start within 60s", run)
	}
	// Let b settle into its follower loop; the random part puts the fault
	// at a random point of its poll and of a's renew cycle.
	sleep(ctx, time.Second+rand.N(l.ttl(system)/2))
	newWrite := func(t0 time.Time) func(Record) bool {
		return func(x Record) bool {
			return x.Kind == KindWrite && x.Writer == idB && x.Accepted && !x.At.Before(t0)
		}
	}
	for _, x := range l.sink.Records(run) {
		if x.Writer == idB && x.Kind == KindWrite {
			return nil, fmt.Errorf("anchorlab: %s: b wrote before the fault", run)
		}
	}
	var t0 time.Time
	switch fault {
	case FaultSigstop:
		t0 = time.Now()
		if err := a.signal(syscall.SIGSTOP); err != nil {
			return nil, err
		}
		l.opts.Log("anchorlab: %s: SIGSTOP a for %v", run, l.opts.Stop)
		sleep(ctx, l.opts.Stop)
		r.FaultS = time.Since(t0).Seconds()
		if err := a.signal(syscall.SIGCONT); err != nil {
			return nil, err
		}
		if _, ok := l.sink.Wait(ctx, run, l.opts.Timeout, newWrite(t0)); !ok {
			l.opts.Log("anchorlab: %s: no new leader after SIGCONT within %v", run, l.opts.Timeout)
		}
		sleep(ctx, l.opts.After)
	case FaultKill9, FaultNetnsDrop:
		t0 = time.Now()
		if fault == FaultKill9 {
			err = a.signal(syscall.SIGKILL)
		} else {
			err = e.fault(a)
		}
		if err != nil {
			return nil, err
		}
		l.opts.Log("anchorlab: %s: fault applied", run)
		_, ok := l.sink.Wait(ctx, run, l.opts.Timeout, newWrite(t0))
		r.FaultS = time.Since(t0).Seconds()
		if ok {
			sleep(ctx, l.opts.After)
		}
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	a.kill()
	b.kill()
	rows := measure(r, l.sink.Records(run), idA, idB, t0)
	l.opts.Log("anchorlab: %s: %+v", run, rows[0])
	return rows, nil
}

// measure derives the row(s) from the run's records.
func measure(r Row, recs []Record, old, nw string, t0 time.Time) []Row {
	var firstWrite, firstMsg time.Time
	for _, x := range recs {
		if x.Writer != nw || x.At.Before(t0) {
			continue
		}
		if x.Kind == KindWrite && x.Accepted && firstWrite.IsZero() {
			firstWrite = x.At
		}
		if x.Kind == KindMsg && firstMsg.IsZero() {
			firstMsg = x.At
		}
	}
	r.FaultS = ms(r.FaultS)
	for _, x := range recs {
		if x.Writer == old && x.Kind == KindWrite && !x.At.Before(t0) {
			d := ms(x.At.Sub(t0).Seconds())
			r.OldLastS = &d
		}
	}
	if firstWrite.IsZero() {
		out := []Row{r}
		if r.System == SystemEtcd {
			r2 := r
			r2.System = RowEtcdRev
			out[0].Token = "none (not checked)"
			out = append(out, r2)
		}
		return out
	}
	v := ms(firstWrite.Sub(t0).Seconds())
	r.NewLeaderS = &v
	var last time.Time
	for _, x := range recs {
		if x.Writer != old {
			continue
		}
		switch {
		case x.Kind == KindWrite && x.At.After(firstWrite):
			r.DeposedWrites++
			if x.Accepted {
				r.DeposedAccepted++
			} else {
				r.DeposedRejected++
			}
			last = x.At
		case x.Kind == KindRefused && x.At.After(firstWrite):
			r.DeposedRefused++
		case x.Kind == KindMsg && !firstMsg.IsZero() && x.At.After(firstMsg):
			r.DeposedMsgs++
		}
	}
	if !last.IsZero() {
		d := ms(last.Sub(firstWrite).Seconds())
		r.DeposedLastS = &d
	}
	if r.System != SystemEtcd {
		return []Row{r}
	}
	// The same run as a resource that ignores the token sees it: every
	// write that reached it is taken.
	plain := r
	plain.Token = "none (not checked)"
	plain.DeposedAccepted, plain.DeposedRejected = r.DeposedWrites, 0
	withRev := r
	withRev.System = RowEtcdRev
	return []Row{plain, withRev}
}

func ms(v float64) float64 { return math.Round(v*1000) / 1000 }

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func (l *Lab) loopbackEnv(system string) (*env, error) {
	e := &env{sink: l.sinkURL, store: l.pg.DSN("")}
	if system == SystemEtcd {
		e.store = l.etcd.Endpoint
	}
	return e, nil
}

// netnsEnv: the store and the sink in one namespace, a in a second, b in
// a third (leaderlab's namespaces); the fault drops every packet between
// a and the store's address. The sink has its own address on the store's
// bridge, which stays reachable.
func (l *Lab) netnsEnv(ctx context.Context, system string) (*env, error) {
	n, err := leaderlab.SetupNetns(ctx)
	if err != nil {
		return nil, err
	}
	e := &env{wrapA: leaderlab.Wrap(n.Leader), wrapB: leaderlab.Wrap(n.Follower)}
	e.cleanup = append(e.cleanup, func() { n.Close() })
	fail := func(err error) (*env, error) {
		e.close()
		return nil, err
	}
	if out, err := exec.CommandContext(ctx, "ip", "-n", n.DB, "addr", "add", SinkAddr+"/24", "dev", "br0").CombinedOutput(); err != nil {
		return fail(fmt.Errorf("ip addr add %s: %v: %s", SinkAddr, err, out))
	}
	ln, err := listenInNetns(n.DB, SinkAddr+":0")
	if err != nil {
		return fail(err)
	}
	var stopSink func()
	e.sink, stopSink = l.sink.Listen(ln)
	e.cleanup = append(e.cleanup, stopSink)
	e.fault = func(*proc) error { return leaderlab.DropBetween(ctx, n.Leader, leaderlab.DBAddr) }
	if system == SystemEtcd {
		dir, err := os.MkdirTemp("", "anchorlab-etcd-ns-")
		if err != nil {
			return fail(err)
		}
		e.cleanup = append(e.cleanup, func() { os.RemoveAll(dir) })
		listen := net.JoinHostPort(leaderlab.DBAddr, "2379")
		p, err := startEtcdProc(ctx, l.opts.Exe, leaderlab.Wrap(n.DB), dir, listen, l.opts.CandidateLog)
		if err != nil {
			return fail(err)
		}
		e.cleanup = append(e.cleanup, p.kill)
		e.store = "http://" + listen
		return e, nil
	}
	hba, err := os.MkdirTemp("", "anchorlab-hba-")
	if err != nil {
		return fail(err)
	}
	e.cleanup = append(e.cleanup, func() { os.RemoveAll(hba) })
	// The candidates connect from the other namespaces' addresses;
	// initdb's pg_hba.conf trusts only loopback.
	if err := os.Chmod(hba, 0o755); err != nil {
		return fail(err)
	}
	hbaFile := filepath.Join(hba, "pg_hba.conf")
	if err := os.WriteFile(hbaFile, []byte("local all all trust\nhost all all 10.213.0.0/24 trust\n"), 0o644); err != nil {
		return fail(err)
	}
	c, err := pgtest.Start(ctx, pgtest.Options{ListenAddress: leaderlab.DBAddr, Port: 5432, Wrap: leaderlab.Wrap(n.DB),
		Log: l.opts.Log, Settings: map[string]string{"hba_file": hbaFile}})
	if err != nil {
		return fail(err)
	}
	e.cleanup = append(e.cleanup, func() { c.Close() })
	e.store = c.DSN("")
	return e, nil
}
