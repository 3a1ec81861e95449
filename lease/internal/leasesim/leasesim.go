// Package leasesim drives lease managers through faults for tests: a store
// wrapper that can fail, hang or die, cluster members whose owner work logs
// every action with its fencing version and wall time, and the history
// checker that proves no two owners' action intervals overlap.
package leasesim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/lease"
)

// Fault modes of a FaultStore.
const (
	OK   int32 = iota
	Fail       // every call fails with a transient error
	Hang       // every call blocks until its context ends
	Dead       // like Hang, and never recovers (a killed process)
)

// ErrInjected is the transient error of Fail mode.
var ErrInjected = errors.New("leasesim: injected store failure")

// FaultStore wraps a real store with injectable faults (faults the real
// store cannot produce on demand: a hung or dead client process).
type FaultStore struct {
	lease.Store
	mode atomic.Int32
}

// SetMode sets the fault mode.
func (f *FaultStore) SetMode(m int32) { f.mode.Store(m) }

func (f *FaultStore) gate(ctx context.Context) error {
	switch f.mode.Load() {
	case Fail:
		return ErrInjected
	case Hang, Dead:
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

// Acquire implements lease.Store.
func (f *FaultStore) Acquire(ctx context.Context, c lease.Claim) (lease.Token, error) {
	if err := f.gate(ctx); err != nil {
		return lease.Token{}, err
	}
	return f.Store.Acquire(ctx, c)
}

// Renew implements lease.Store.
func (f *FaultStore) Renew(ctx context.Context, id string, tok lease.Token, ttl time.Duration) error {
	if err := f.gate(ctx); err != nil {
		return err
	}
	return f.Store.Renew(ctx, id, tok, ttl)
}

// Release implements lease.Store.
func (f *FaultStore) Release(ctx context.Context, id string, tok lease.Token) error {
	if err := f.gate(ctx); err != nil {
		return err
	}
	return f.Store.Release(ctx, id, tok)
}

// Current implements lease.Store.
func (f *FaultStore) Current(ctx context.Context, id string) (lease.Record, error) {
	if err := f.gate(ctx); err != nil {
		return lease.Record{}, err
	}
	return f.Store.Current(ctx, id)
}

// Action is one thing an owner did: who, under which fencing version, when.
type Action struct {
	Member  string
	Owner   string
	Version int64
	At      time.Time
}

// History collects actions from all members.
type History struct {
	mu      sync.Mutex
	actions []Action
}

// Record logs an action.
func (h *History) Record(a Action) {
	h.mu.Lock()
	h.actions = append(h.actions, a)
	h.mu.Unlock()
}

// Len is the number of actions logged.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.actions)
}

// Tenures returns the number of distinct fencing versions that acted.
func (h *History) Tenures() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[int64]bool{}
	for _, a := range h.actions {
		seen[a.Version] = true
	}
	return len(seen)
}

// Check verifies that every fencing version belongs to one owner and that
// the action intervals [first, last] of different versions never overlap,
// and that they are ordered by version.
func (h *History) Check() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	type span struct {
		owner       string
		first, last time.Time
	}
	spans := map[int64]*span{}
	for _, a := range h.actions {
		s, ok := spans[a.Version]
		if !ok {
			spans[a.Version] = &span{owner: a.Owner, first: a.At, last: a.At}
			continue
		}
		if s.owner != a.Owner {
			return fmt.Errorf("fencing version %d used by two owners: %s and %s", a.Version, s.owner, a.Owner)
		}
		if a.At.Before(s.first) {
			s.first = a.At
		}
		if a.At.After(s.last) {
			s.last = a.At
		}
	}
	versions := make([]int64, 0, len(spans))
	for v := range spans {
		versions = append(versions, v)
	}
	sort.Slice(versions, func(i, j int) bool { return versions[i] < versions[j] })
	for i := 1; i < len(versions); i++ {
		a, b := spans[versions[i-1]], spans[versions[i]]
		if !a.last.Before(b.first) {
			return fmt.Errorf("owners overlap: v%d (%s) acted until %s, v%d (%s) acted from %s",
				versions[i-1], a.owner, a.last.Format(time.RFC3339Nano), versions[i], b.owner, b.first.Format(time.RFC3339Nano))
		}
	}
	return nil
}

// Member is one cluster member: a manager on its own store handle whose
// owner work acts every ActEvery while its tenure is valid.
type Member struct {
	Name    string
	Store   *FaultStore
	Manager *lease.Manager

	cancel context.CancelFunc
	killed atomic.Bool
	paused atomic.Bool
	done   chan struct{}
	err    error
}

// MemberConfig configures StartMember.
type MemberConfig struct {
	Name     string
	Session  string
	Store    lease.Store
	Cadence  failover.Cadence
	History  *History
	ActEvery time.Duration
	// DependencyStepDown is passed to the manager.
	DependencyStepDown time.Duration
	Logger             *slog.Logger
}

// StartMember starts a member; it runs until Kill or Stop.
func StartMember(t testing.TB, cfg MemberConfig) *Member {
	t.Helper()
	m := &Member{Name: cfg.Name, Store: &FaultStore{Store: cfg.Store}, done: make(chan struct{})}
	if cfg.ActEvery <= 0 {
		cfg.ActEvery = 5 * time.Millisecond
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	mgr, err := lease.New(lease.Config{
		Store:              m.Store,
		Session:            cfg.Session,
		Owner:              lease.OwnerID(cfg.Name) + "-" + fmt.Sprint(time.Now().UnixNano()),
		Endpoint:           cfg.Name,
		Cadence:            cfg.Cadence,
		DependencyStepDown: cfg.DependencyStepDown,
		Logger:             log.With("member", cfg.Name),
		OnOwner: func(own *lease.Ownership) {
			for {
				if m.killed.Load() {
					return
				}
				// The action's instant is read before the validity check,
				// so a stall between the two can only drop the action,
				// never date it after the tenure ended.
				at := time.Now()
				if !m.paused.Load() && own.Valid() && cfg.History != nil {
					cfg.History.Record(Action{Member: cfg.Name, Owner: own.Token().Owner, Version: own.Token().Version, At: at})
				}
				select {
				case <-own.Context().Done():
					return
				case <-own.Stopping():
					return
				case <-time.After(cfg.ActEvery):
				}
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	m.Manager = mgr
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go func() {
		defer close(m.done)
		m.err = mgr.Run(ctx)
	}()
	return m
}

// Kill simulates a crash: the work stops at once, the store is dead, and
// the manager is cancelled without any chance to release.
func (m *Member) Kill() {
	m.killed.Store(true)
	m.Store.SetMode(Dead)
	m.cancel()
	<-m.done
}

// Pause freezes the member's store calls and its work (as SIGSTOP would);
// Resume thaws them. The monotonic clock keeps running, as it does for a
// stopped process.
func (m *Member) Pause() { m.paused.Store(true); m.Store.SetMode(Hang) }

// Resume undoes Pause.
func (m *Member) Resume() { m.Store.SetMode(OK); m.paused.Store(false) }

// Stop shuts the member down cleanly (step-down and release) and returns
// Run's error.
func (m *Member) Stop() error {
	m.cancel()
	<-m.done
	return m.err
}

// Done is closed when the manager's Run has returned.
func (m *Member) Done() <-chan struct{} { return m.done }

// Err is Run's error after Done.
func (m *Member) Err() error { return m.err }

// WaitOwner polls until one of members owns the lease and returns it.
func WaitOwner(t testing.TB, limit time.Duration, members ...*Member) *Member {
	t.Helper()
	end := time.Now().Add(limit)
	for time.Now().Before(end) {
		for _, m := range members {
			if o := m.Manager.Ownership(); o != nil && o.Valid() {
				return m
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no member owned the lease within %v", limit)
	return nil
}

// Owners returns the members whose tenure is currently valid.
func Owners(members ...*Member) []*Member {
	var out []*Member
	for _, m := range members {
		if o := m.Manager.Ownership(); o != nil && o.Valid() {
			out = append(out, m)
		}
	}
	return out
}

// TestCadence is a short cadence that failover.ResolveCadence admits:
// lease_ttl 5s, renew_interval 1s, renew_call_timeout 500ms,
// acquire_poll_interval 250ms, step_down_grace 1s, max_renew_fails 3.
func TestCadence(t testing.TB) failover.Cadence {
	t.Helper()
	c, _, err := failover.ResolveCadence(failover.LeaseConfig{LeaseTTL: 5 * time.Second, RenewInterval: time.Second,
		RenewCallTimeout: 500 * time.Millisecond, AcquirePollInterval: 250 * time.Millisecond, StepDownGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// FastCadence is a cadence below the admitted minimums, for randomized
// runs that need many tenures: TTL 1s, renew 200ms (jitter 50ms), call
// timeout 150ms, poll 100ms, grace 200ms. The manager accepts any positive
// cadence; only the bridge's admission enforces the minimums.
func FastCadence() failover.Cadence {
	return failover.Cadence{LeaseTTL: time.Second, RenewInterval: 200 * time.Millisecond, LeaseRenewJitter: 50 * time.Millisecond,
		RenewCallTimeout: 150 * time.Millisecond, AcquirePollInterval: 100 * time.Millisecond, MaxRenewFails: 3,
		StepDownGrace: 200 * time.Millisecond}
}

// TestActivation is the small declared activation bound of the tests'
// owner work, which is active as soon as it owns.
var TestActivation = failover.Activation{Transport: "test", Known: true, Bound: time.Second, Formula: "declared bound of the test worker"}
