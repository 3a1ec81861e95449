package lease_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/testwait"
	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/internal/leasesim"
	"github.com/myriarch/myriarch/lease/sqlitestore"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func openStore(t testing.TB, path string) lease.Store {
	t.Helper()
	s, err := sqlitestore.Open(context.Background(), path, sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

type run struct {
	m      *lease.Manager
	cancel context.CancelFunc
	done   chan error
}

func start(t testing.TB, cfg lease.Config) *run {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	m, err := lease.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &run{m: m, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

func (r *run) wait(t testing.TB, limit time.Duration) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err
		return err
	case <-time.After(limit):
		t.Fatalf("Run did not return within %v", limit)
		return nil
	}
}

func waitEvent(t testing.TB, r *run, kind lease.EventKind, limit time.Duration) lease.Event {
	t.Helper()
	tm := time.After(limit)
	for {
		select {
		case e := <-r.m.Events():
			if e.Kind == kind {
				return e
			}
		case <-tm:
			t.Fatalf("no %v event within %v", kind, limit)
		}
	}
}

// cadence is the fast cadence with a TTL long enough that a stalled,
// overloaded test machine does not cost the owner its lease, and a
// step_down_grace that gives each bounded step-down phase (the release
// call among them) a second rather than 200ms: a release through sqlite
// on a loaded machine took longer than 200ms and was abandoned.
func cadence() failover.Cadence {
	c := leasesim.FastCadence()
	c.LeaseTTL = 3 * time.Second
	c.StepDownGrace = time.Second
	return c
}

func owns(r *run) bool { o := r.m.Ownership(); return o != nil && o.Valid() }

func TestAcquireRenewShutdownRelease(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "l.db")
	reg := prometheus.NewRegistry()
	c := cadence()
	var closed atomic.Int32
	a := start(t, lease.Config{Store: openStore(t, path), Session: "s", InstanceID: "a", Endpoint: "a:1", Cadence: c,
		Registerer: reg, CloseSource: func(context.Context) error { closed.Add(1); return nil },
		OnOwner: func(own *lease.Ownership) { <-own.Stopping() }})
	if !strings.HasPrefix(a.m.OwnerID(), "a#") || a.m.OwnerID() != lease.OwnerID("a") {
		t.Fatalf("owner id %q, want a#<boot nonce>", a.m.OwnerID())
	}
	acq := waitEvent(t, a, lease.EventAcquired, 10*time.Second)
	waitEvent(t, a, lease.EventRenewed, 10*time.Second)
	if got := testutil.ToFloat64(mustGauge(t, reg, lease.MetricIsOwner)); got != 1 {
		t.Fatalf("is_owner = %v", got)
	}
	if got := testutil.ToFloat64(mustGauge(t, reg, lease.MetricFencingVersion)); got != float64(acq.Token.Version) {
		t.Fatalf("fencing_version = %v, want %d", got, acq.Token.Version)
	}
	// A standby with its own store handle waits.
	b := start(t, lease.Config{Store: openStore(t, path), Session: "s", InstanceID: "b", Cadence: c, Registerer: reg})
	time.Sleep(3 * c.AcquirePollInterval) // b polls while a renews
	a.cancel()
	if err := a.wait(t, 10*time.Second); err != nil {
		t.Fatalf("Run after shutdown: %v", err)
	}
	sd := waitEvent(t, a, lease.EventSteppedDown, time.Second)
	if sd.Reason != lease.ReasonShutdown {
		t.Fatalf("step-down reason %q", sd.Reason)
	}
	if rel := waitEvent(t, a, lease.EventReleased, time.Second); rel.Err != nil {
		t.Fatalf("release: %v", rel.Err)
	}
	if closed.Load() != 1 {
		t.Fatalf("CloseSource called %d times", closed.Load())
	}
	// Released: the standby takes it at its next poll, with a higher version.
	// b's event stream covers the whole interval: its first acquisition
	// comes after a stepped down, never while a renewed.
	bacq := waitEvent(t, b, lease.EventAcquired, 2*c.MaxJitteredPoll()+2*time.Second)
	if bacq.Token.Version <= acq.Token.Version {
		t.Fatalf("version %d after %d", bacq.Token.Version, acq.Token.Version)
	}
	if bacq.Time.Before(sd.Time) {
		t.Fatalf("standby acquired at %v, before the owner stepped down at %v", bacq.Time, sd.Time)
	}
	if n := testutil.CollectAndCount(reg, lease.MetricStepDowns); n == 0 {
		t.Fatal("no step-down metric")
	}
}

func mustGauge(t testing.TB, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name})
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "session" && l.GetValue() == "s" {
						g.Set(m.GetGauge().GetValue())
					}
				}
			}
			return g
		}
	}
	t.Fatalf("metric %s not registered", name)
	return nil
}

func TestBrokerPathStepDownIsTerminal(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "l.db")
	c := cadence()
	var closed atomic.Int32
	// The threshold is well above the blip below: a test goroutine that a
	// loaded machine schedules late must not make the blip a real outage.
	const threshold = time.Second
	a := start(t, lease.Config{Store: openStore(t, path), Session: "s", InstanceID: "a", Cadence: c,
		DependencyStepDown: threshold,
		CloseSource:        func(context.Context) error { closed.Add(1); return nil }})
	waitEvent(t, a, lease.EventAcquired, 10*time.Second)
	// A blip shorter than the threshold does nothing.
	a.m.ReportDependency(false)
	time.Sleep(100 * time.Millisecond)
	a.m.ReportDependency(true)
	time.Sleep(3 * c.RenewInterval)
	if !owns(a) {
		t.Fatal("a short broker-path blip stepped the owner down")
	}
	b := start(t, lease.Config{Store: openStore(t, path), Session: "s", InstanceID: "b", Cadence: c})
	lostAt := time.Now()
	a.m.ReportDependency(false)
	err := a.wait(t, 10*time.Second)
	if !errors.Is(err, lease.ErrDependencyStepDown) {
		t.Fatalf("Run = %v, want ErrDependencyStepDown", err)
	}
	if el := time.Since(lostAt); el < threshold {
		t.Fatalf("stepped down %v after the path was lost, before the threshold", el)
	}
	if closed.Load() != 1 {
		t.Fatalf("CloseSource called %d times", closed.Load())
	}
	// The released lease goes to the standby, and the old owner never
	// competes again (its Run returned).
	testwait.Until(t, "standby owns", 2*c.MaxJitteredPoll()+5*time.Second, func() bool { return owns(b) })
}

// renewFaults fails Renew (only) while failing is set.
type renewFaults struct {
	lease.Store
	failing atomic.Bool
	hang    atomic.Bool
}

func (f *renewFaults) Renew(ctx context.Context, id string, tok lease.Token, ttl time.Duration) error {
	if f.hang.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	if f.failing.Load() {
		return errors.New("injected transient renew failure")
	}
	return f.Store.Renew(ctx, id, tok, ttl)
}

func TestLocalDeadlineStepsDown(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "l.db")
	c := leasesim.FastCadence()
	st := &renewFaults{Store: openStore(t, path)}
	a := start(t, lease.Config{Store: st, Session: "s", InstanceID: "a", Cadence: c,
		OnOwner: func(own *lease.Ownership) { <-own.Context().Done() }})
	acq := waitEvent(t, a, lease.EventAcquired, 10*time.Second)
	own := a.m.Ownership()
	hungAt := time.Now()
	st.hang.Store(true) // renews hang; the store still names us
	lost := waitEvent(t, a, lease.EventLost, 3*c.LeaseTTL)
	if lost.Reason != lease.ReasonDeadline {
		t.Fatalf("loss reason %q, want deadline", lost.Reason)
	}
	if own.Valid() || !errors.Is(context.Cause(own.Context()), lease.ErrExpired) {
		t.Fatalf("tenure still valid or wrong cause: %v", context.Cause(own.Context()))
	}
	if el := time.Since(hungAt); el > c.LeaseTTL+time.Second {
		t.Fatalf("stepped down %v after renews stopped working; TTL %v", el, c.LeaseTTL)
	}
	st.hang.Store(false)
	// Back to standing by; the row still names us, so we re-acquire at
	// once with a higher version.
	re := waitEvent(t, a, lease.EventAcquired, 10*time.Second)
	if re.Token.Version <= acq.Token.Version {
		t.Fatalf("re-acquired at version %d after %d", re.Token.Version, acq.Token.Version)
	}
}

func TestRenewFailureStreakAuthoritativeRead(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "l.db")
	c := leasesim.FastCadence()
	// Room for several rounds of failures and the supersession below
	// before the local deadline, which would be the wrong reason.
	c.LeaseTTL = 6 * time.Second
	st := &renewFaults{Store: openStore(t, path)}
	a := start(t, lease.Config{Store: st, Session: "s", InstanceID: "a", Cadence: c})
	acq := waitEvent(t, a, lease.EventAcquired, 10*time.Second)
	st.failing.Store(true)
	// While the store still names us, a failure streak keeps the lease.
	time.Sleep(time.Duration(c.MaxRenewFails+1) * (c.RenewInterval + c.LeaseRenewJitter))
	if !owns(a) {
		t.Fatal("stepped down after transient failures while the store still names us")
	}
	// Someone supersedes the token (the same owner id through another
	// handle): the next authoritative read decides.
	other := openStore(t, path)
	if _, err := other.Acquire(context.Background(), lease.Claim{ID: "s", Owner: acq.Token.Owner, TTL: c.LeaseTTL}); err != nil {
		t.Fatal(err)
	}
	lost := waitEvent(t, a, lease.EventLost, 4*time.Second)
	if lost.Reason != lease.ReasonRenewFailures || !errors.Is(lost.Err, lease.ErrLost) {
		t.Fatalf("loss %q %v, want renew_failures / ErrLost", lost.Reason, lost.Err)
	}
}

func TestEventsNeverBlock(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "l.db")
	reg := prometheus.NewRegistry()
	c := cadence()
	a := start(t, lease.Config{Store: openStore(t, path), Session: "s", InstanceID: "a", Cadence: c, EventBuffer: 1, Registerer: reg})
	testwait.Until(t, "several renews with nobody reading events", 10*time.Second, func() bool {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == lease.MetricEventsDropped {
				return mf.GetMetric()[0].GetCounter().GetValue() >= 3
			}
		}
		return false
	})
	if !owns(a) {
		t.Fatal("not owner")
	}
}

func TestNewValidates(t *testing.T) {
	good := lease.Config{Store: openStore(t, filepath.Join(t.TempDir(), "l.db")), Session: "s", InstanceID: "i", Cadence: leasesim.FastCadence()}
	if _, err := lease.New(good); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*lease.Config){
		"no store":        func(c *lease.Config) { c.Store = nil },
		"no session":      func(c *lease.Config) { c.Session = "" },
		"no instance":     func(c *lease.Config) { c.InstanceID = "" },
		"zero cadence":    func(c *lease.Config) { c.Cadence = failover.Cadence{} },
		"call above ttl":  func(c *lease.Config) { c.Cadence.RenewCallTimeout = 2 * c.Cadence.LeaseTTL },
		"negative broker": func(c *lease.Config) { c.DependencyStepDown = -1 },
	} {
		cfg := good
		mut(&cfg)
		if _, err := lease.New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestSharedRegisterer(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := openStore(t, filepath.Join(t.TempDir(), "l.db"))
	for _, id := range []string{"s1", "s2"} {
		if _, err := lease.New(lease.Config{Store: s, Session: id, InstanceID: "i", Cadence: leasesim.FastCadence(), Registerer: reg}); err != nil {
			t.Fatalf("second manager on one registerer: %v", err)
		}
	}
}

// The broker-path failover of an admitted cadence, measured from the
// transport reporting the path lost to the standby owning, stays within
// failover.BrokerPathBudget.
func TestBrokerPathFailoverWithinBudget(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "l.db")
	c := leasesim.TestCadence(t)
	const threshold = 500 * time.Millisecond
	budget, err := failover.BrokerPathBudget(c, threshold, leasesim.TestActivation, 0)
	if err != nil {
		t.Fatal(err)
	}
	a := start(t, lease.Config{Store: openStore(t, path), Session: "s", InstanceID: "a", Cadence: c,
		DependencyStepDown: threshold, OnOwner: func(own *lease.Ownership) { <-own.Stopping() }})
	waitEvent(t, a, lease.EventAcquired, 10*time.Second)
	b := start(t, lease.Config{Store: openStore(t, path), Session: "s", InstanceID: "b", Cadence: c})
	time.Sleep(2 * c.AcquirePollInterval)
	lost := time.Now()
	a.m.ReportDependency(false)
	testwait.Until(t, "standby owns after the broker-path step-down", budget.Total+10*time.Second, func() bool { return owns(b) })
	took := time.Since(lost)
	if took > budget.Total {
		t.Fatalf("standby owned %v after the broker path was lost; broker-path budget %v", took, budget)
	}
	if err := a.wait(t, time.Second); !errors.Is(err, lease.ErrDependencyStepDown) {
		t.Fatalf("Run = %v", err)
	}
	t.Logf("broker-path failover: standby owned %v after the path was lost (budget %v)", took.Round(time.Millisecond), budget.Total)
}

// stubborn is a store whose selected calls block until unblock is closed,
// ignoring their context: a buggy or wedged Store implementation (a real
// store cannot be made to do that on demand).
type stubborn struct {
	lease.Store
	renew, acquire atomic.Bool
	acquires       atomic.Int32
	unblock        chan struct{}
}

func newStubborn(t *testing.T, s lease.Store) *stubborn {
	st := &stubborn{Store: s, unblock: make(chan struct{})}
	t.Cleanup(func() { close(st.unblock) })
	return st
}

var errUnblocked = errors.New("stubborn call unblocked")

func (s *stubborn) Renew(ctx context.Context, id string, tok lease.Token, ttl time.Duration) error {
	if s.renew.Load() {
		<-s.unblock
		return errUnblocked
	}
	return s.Store.Renew(ctx, id, tok, ttl)
}

func (s *stubborn) Acquire(ctx context.Context, c lease.Claim) (lease.Token, error) {
	s.acquires.Add(1)
	if s.acquire.Load() {
		<-s.unblock
		return lease.Token{}, errUnblocked
	}
	return s.Store.Acquire(ctx, c)
}

// The budgets count one renew_call_timeout per store call and
// min(5s, step_down_grace) per bounded step-down phase. A store call or a
// CloseSource that ignores its context must not stretch them: the manager
// stops waiting at the bound. (Before, a wedged Renew froze the renew loop
// past the local deadline with no step-down and no release, a wedged
// Acquire stopped a standby from ever polling again, and a wedged
// CloseSource kept Run from returning.)
func TestCallsThatIgnoreTheirContextAreBounded(t *testing.T) {
	t.Parallel()
	c := cadence()
	phase := c.StepDownPhaseBound()

	t.Run("renew", func(t *testing.T) {
		t.Parallel()
		st := newStubborn(t, openStore(t, filepath.Join(t.TempDir(), "l.db")))
		a := start(t, lease.Config{Store: st, Session: "s", InstanceID: "a", Cadence: c})
		waitEvent(t, a, lease.EventAcquired, 10*time.Second)
		own := a.m.Ownership()
		st.renew.Store(true)
		lost := waitEvent(t, a, lease.EventLost, c.LeaseTTL+5*time.Second)
		if lost.Reason != lease.ReasonDeadline {
			t.Fatalf("loss reason %q, want deadline", lost.Reason)
		}
		if own.Valid() {
			t.Fatal("tenure still valid after the loss")
		}
		if rel := waitEvent(t, a, lease.EventReleased, 2*phase+5*time.Second); rel.Err != nil {
			t.Fatalf("release after the deadline: %v", rel.Err)
		}
	})

	t.Run("acquire", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "l.db")
		a := start(t, lease.Config{Store: openStore(t, path), Session: "s", InstanceID: "a", Cadence: c})
		waitEvent(t, a, lease.EventAcquired, 10*time.Second)
		st := newStubborn(t, openStore(t, path))
		st.acquire.Store(true)
		b := start(t, lease.Config{Store: st, Session: "s", InstanceID: "b", Cadence: c})
		// One poll costs at most renew_call_timeout + max_jittered_poll.
		testwait.Until(t, "the standby keeps polling past wedged Acquire calls", 20*(c.RenewCallTimeout+c.MaxJitteredPoll())+5*time.Second,
			func() bool { return st.acquires.Load() >= 5 })
		stopped := time.Now()
		b.cancel()
		if err := b.wait(t, c.RenewCallTimeout+5*time.Second); err != nil {
			t.Fatal(err)
		}
		t.Logf("standby stopped %v after cancel with an Acquire wedged", time.Since(stopped).Round(time.Millisecond))
	})

	t.Run("close source", func(t *testing.T) {
		t.Parallel()
		unblock := make(chan struct{})
		t.Cleanup(func() { close(unblock) })
		a := start(t, lease.Config{Store: openStore(t, filepath.Join(t.TempDir(), "l.db")), Session: "s", InstanceID: "a", Cadence: c,
			CloseSource: func(context.Context) error { <-unblock; return nil }})
		waitEvent(t, a, lease.EventAcquired, 10*time.Second)
		a.cancel()
		// Three bounded phases: close, grace, release.
		if err := a.wait(t, 2*phase+c.StepDownGrace+5*time.Second); err != nil {
			t.Fatal(err)
		}
		if rel := waitEvent(t, a, lease.EventReleased, time.Second); rel.Err != nil {
			t.Fatalf("release: %v", rel.Err)
		}
	})
}

// counting fails every Renew while failing is set and counts the Renew
// and Current calls, in order.
type counting struct {
	lease.Store
	failing atomic.Bool
	mu      sync.Mutex
	calls   []string
}

func (c *counting) note(s string) {
	c.mu.Lock()
	c.calls = append(c.calls, s)
	c.mu.Unlock()
}

func (c *counting) log() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

func (c *counting) Renew(ctx context.Context, id string, tok lease.Token, ttl time.Duration) error {
	if c.failing.Load() {
		c.note("renew")
		return errors.New("injected transient renew failure")
	}
	return c.Store.Renew(ctx, id, tok, ttl)
}

func (c *counting) Current(ctx context.Context, id string) (lease.Record, error) {
	c.note("current")
	return c.Store.Current(ctx, id)
}

// The broker-path budget counts two store calls in a detection round: the
// renew and, once the failure streak has reached max_renew_fails, one
// authoritative read on that round and on every later one, never earlier
// and never more than one per round.
func TestAuthoritativeReadCadence(t *testing.T) {
	t.Parallel()
	c := cadence()
	c.LeaseTTL = 10 * time.Second // the failing rounds end long before the local deadline
	st := &counting{Store: openStore(t, filepath.Join(t.TempDir(), "l.db"))}
	a := start(t, lease.Config{Store: st, Session: "s", InstanceID: "a", Cadence: c})
	waitEvent(t, a, lease.EventAcquired, 10*time.Second)
	st.failing.Store(true)
	rounds := c.MaxRenewFails + 3
	testwait.Until(t, "failing renew rounds", 30*time.Second, func() bool {
		n := 0
		for _, s := range st.log() {
			if s == "renew" {
				n++
			}
		}
		return n > rounds // the renew of round rounds+1 comes after the read of round rounds
	})
	st.failing.Store(false)
	got := st.log()
	var want []string
	for i := 1; i <= rounds; i++ {
		want = append(want, "renew")
		if i >= c.MaxRenewFails {
			want = append(want, "current")
		}
	}
	// Compare the completed rounds; the one in progress when failing was
	// cleared may or may not have made its read yet.
	if len(got) < len(want) || !slices.Equal(got[:len(want)], want) {
		t.Fatalf("store calls %v, want %v", got, want)
	}
	if !owns(a) {
		t.Fatal("stepped down although the authoritative read named us")
	}
}

// A tenure whose work does not return when it is cancelled holds back the
// next tenure of the same manager: the next Acquire waits until the work
// returned, so that no two tenures of one process act at once.
func TestNextTenureWaitsForThePreviousWork(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "l.db")
	c := cadence()
	clk := &lease.JumpClock{}
	release := make(chan struct{})
	var tenures, running atomic.Int32
	var overlap atomic.Bool
	a := start(t, lease.Config{Store: openStore(t, path), Session: "s", InstanceID: "a", Cadence: c, Clock: clk,
		OnOwner: func(own *lease.Ownership) {
			if running.Add(1) > 1 {
				overlap.Store(true)
			}
			defer running.Add(-1)
			if tenures.Add(1) == 1 {
				<-release // ignores its cancellation
			}
		}})
	first := waitEvent(t, a, lease.EventAcquired, 10*time.Second)
	clk.Jump(c.LeaseTTL) // "slept" through the deadline
	waitEvent(t, a, lease.EventSteppedDown, 3*c.LeaseTTL)
	// Well past the step-down bound and several polls: still no new
	// tenure, because the first one's work has not returned.
	time.Sleep(c.StepDownPhaseBound() + 2*c.MaxJitteredPoll())
	if a.m.Ownership() != nil || tenures.Load() != 1 {
		t.Fatalf("a new tenure started while the previous work still ran (tenures %d)", tenures.Load())
	}
	close(release)
	re := waitEvent(t, a, lease.EventAcquired, 10*time.Second)
	if re.Token.Version <= first.Token.Version || overlap.Load() {
		t.Fatalf("re-acquired v%d after v%d; overlap %v", re.Token.Version, first.Token.Version, overlap.Load())
	}
}

// A broker-path report of an ended tenure does not reach the next one.
func TestStaleTenureBrokerPathReportIgnored(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "l.db")
	c := cadence()
	clk := &lease.JumpClock{}
	a := start(t, lease.Config{Store: openStore(t, path), Session: "s", InstanceID: "a", Cadence: c, Clock: clk,
		DependencyStepDown: 200 * time.Millisecond})
	waitEvent(t, a, lease.EventAcquired, 10*time.Second)
	old := a.m.Ownership()
	clk.Jump(c.LeaseTTL)
	waitEvent(t, a, lease.EventAcquired, 3*c.LeaseTTL)
	old.ReportDependency(false) // late, from the ended tenure
	time.Sleep(200*time.Millisecond + 3*c.RenewInterval)
	if !owns(a) {
		t.Fatal("a stale tenure's broker-path report stepped the new tenure down")
	}
	// The new tenure's own report does.
	a.m.Ownership().ReportDependency(false)
	if err := a.wait(t, 10*time.Second); !errors.Is(err, lease.ErrDependencyStepDown) {
		t.Fatalf("Run = %v, want ErrDependencyStepDown", err)
	}
}

// The successor knows a time at which its predecessor was still alive:
// before the predecessor stopped, and after the successor started.
func TestPreviousOwnerAlive(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "l.db")
	c := cadence()
	a := start(t, lease.Config{Store: openStore(t, path), Session: "s", InstanceID: "a", Cadence: c})
	waitEvent(t, a, lease.EventAcquired, 10*time.Second)
	if _, ok := a.m.Ownership().PreviousOwnerAlive(); ok {
		t.Fatal("the first owner of a free lease reports a predecessor")
	}
	bStart := time.Now()
	b := start(t, lease.Config{Store: openStore(t, path), Session: "s", InstanceID: "b", Cadence: c})
	// Let b see a few of a's renewals.
	time.Sleep(3*c.RenewInterval + 2*c.MaxJitteredPoll())
	stopped := time.Now()
	a.cancel()
	if err := a.wait(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, "b owns", 2*c.LeaseTTL+10*time.Second, func() bool { return owns(b) })
	at, ok := b.m.Ownership().PreviousOwnerAlive()
	if !ok || at.Before(bStart) || !at.Before(stopped) {
		t.Fatalf("PreviousOwnerAlive = %v, %v; want within [b's start, a's stop] = [%v, %v]", at, ok, bStart, stopped)
	}
}
