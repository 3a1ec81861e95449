// Package waketest checks, for any lease store, that a standby takes a
// released lease at once instead of at its next poll.
package waketest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/lease"
)

// counting counts a standby's Acquire calls and passes NotifyRelease on.
type counting struct {
	lease.Store
	acquires atomic.Int64
}

func (c *counting) Acquire(ctx context.Context, cl lease.Claim) (lease.Token, error) {
	c.acquires.Add(1)
	return c.Store.Acquire(ctx, cl)
}

func (c *counting) NotifyRelease(ctx context.Context, id string) <-chan struct{} {
	if n, ok := c.Store.(lease.ReleaseNotifier); ok {
		return n.NotifyRelease(ctx, id)
	}
	return nil
}

// cadence polls once an hour: a standby that takes over within the test's
// limit can only have been woken by the store.
var cadence = failover.Cadence{LeaseTTL: 2 * time.Hour, RenewInterval: 10 * time.Second, RenewCallTimeout: 5 * time.Second,
	MaxRenewFails: 3, StepDownGrace: time.Second, AcquirePollInterval: time.Hour}

func waitEvent(t *testing.T, m *lease.Manager, kind lease.EventKind, limit time.Duration) {
	t.Helper()
	deadline := time.After(limit)
	for {
		select {
		case e := <-m.Events():
			if e.Kind == kind {
				return
			}
		case <-deadline:
			t.Fatalf("no %v event within %v", kind, limit)
		}
	}
}

// ReleaseWakesStandby runs an owner and a standby, each on a store of its
// own from open, then stops the owner (which releases its lease): the
// standby acquires although its poll is an hour away.
func ReleaseWakesStandby(t *testing.T, open func(t *testing.T) lease.Store) {
	const session = "wake-test"
	ownerStore, standbyStore := open(t), &counting{Store: open(t)}
	newManager := func(s lease.Store, id string) *lease.Manager {
		m, err := lease.New(lease.Config{Store: s, Session: session, InstanceID: id, Cadence: cadence, EventBuffer: 64})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	owner, standby := newManager(ownerStore, "owner"), newManager(standbyStore, "standby")
	octx, ostop := context.WithCancel(context.Background())
	odone := make(chan error, 1)
	go func() { odone <- owner.Run(octx) }()
	defer func() { ostop(); <-odone }()
	waitEvent(t, owner, lease.EventAcquired, 30*time.Second)

	sctx, sstop := context.WithCancel(context.Background())
	sdone := make(chan error, 1)
	go func() { sdone <- standby.Run(sctx) }()
	defer func() { sstop(); <-sdone }()
	for start := time.Now(); standbyStore.acquires.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 30*time.Second {
			t.Fatal("the standby never tried to acquire")
		}
	}
	// Wait until the store's watch has begun (a release before it only
	// falls back to the poll, an hour away): a fixed pause was not always
	// enough on a loaded machine.
	watching(t, ownerStore, standbyStore.Store)

	ostop() // planned stop: the owner releases its lease
	if err := <-odone; err != nil {
		t.Fatalf("owner Run: %v", err)
	}
	odone <- nil
	released := time.Now()
	waitEvent(t, standby, lease.EventAcquired, 30*time.Second)
	t.Logf("the standby acquired %v after the owner's Run returned (its poll: %v)", time.Since(released).Round(time.Microsecond), cadence.AcquirePollInterval)
	if n := standbyStore.acquires.Load(); n != 2 {
		t.Errorf("the standby called Acquire %d times; want 2 (the baseline and the one the release woke)", n)
	}
}

// watching returns once the release watch of standby's store reports the
// releases that owner writes. It subscribes to a probe lease of its own on
// standby's store (the store shares one watch among all its subscribers,
// the standby's too) and releases the probe through owner until the
// subscription reports it.
func watching(t *testing.T, owner, standby lease.Store) {
	t.Helper()
	n, ok := standby.(lease.ReleaseNotifier)
	if !ok {
		t.Fatalf("%T cannot report releases", standby)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const probe = "wake-test-probe"
	ch := n.NotifyRelease(ctx, probe)
	if ch == nil {
		t.Fatalf("%T reports no releases (nil channel)", standby)
	}
	for start := time.Now(); ; {
		if time.Since(start) > 30*time.Second {
			t.Fatal("the standby's store did not report a release within 30s: its watch never began")
		}
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		tok, err := owner.Acquire(cctx, lease.Claim{ID: probe, Owner: "probe#1", TTL: time.Minute})
		if err == nil {
			err = owner.Release(cctx, probe, tok)
		}
		ccancel()
		if err != nil {
			t.Fatalf("probe lease: %v", err)
		}
		select {
		case <-ch:
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}
