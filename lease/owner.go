package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"sync/atomic"
	"time"
)

var bootNonce = sync.OnceValue(func() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand does not fail on supported platforms; a clock-based
		// nonce is still unique per boot in practice.
		return hex.EncodeToString([]byte(time.Now().Format(time.RFC3339Nano)))
	}
	return hex.EncodeToString(b[:])
})

// BootNonce is this process's random boot nonce, the same for its whole
// life and different in every process.
func BootNonce() string { return bootNonce() }

// OwnerID returns the owner id of this process for instance:
// "instance#boot-nonce". A restarted process gets a new owner id, so it
// never mistakes its predecessor's lease for its own.
func OwnerID(instance string) string { return instance + "#" + BootNonce() }

// Ownership is one tenure of the lease: from a successful Acquire to the
// step-down. The owner's work runs under it.
//
// Context is cancelled when the tenure ends for any reason, and at the
// latest at the local deadline (the pre-call time of the last successful
// Acquire or Renew plus TTL·(1 − DeadlineMargin)) if no renew extended it.
// Stopping is closed when the step-down starts, before the source is closed
// and the settlement grace begins: the work should stop taking new input,
// settle what is in flight and return.
type Ownership struct {
	token    Token
	clock    Clock
	ctx      context.Context
	cancel   context.CancelCauseFunc
	stopping chan struct{}
	stopOnce sync.Once

	// m is the manager of the tenure (nil in tests that build one
	// directly); prevAlive is PreviousOwnerAlive.
	m         *Manager
	prevAlive time.Time

	// mu orders the deadline's writers (extend, expire); deadline is
	// read without it, so that Valid, checked at every point of action
	// of the owner's work (three times per message an exclusive bridge
	// session moves), never waits for the renewer.
	mu       sync.Mutex
	deadline atomic.Pointer[time.Time]
	watchdog *time.Timer
}

// PreviousOwnerAlive is the latest time at which the owner before this
// tenure is known to have been alive and holding the lease, as a reading
// of time.Now (monotonic, this process): the start of the last standby
// poll that read the row before that owner's last observed renewal.
// Every failure of that owner happened after it, so the time from
// it to this tenure's full service is an upper bound of failure-to-full on
// one clock. ok is false when this standby observed no renewal of another
// owner (the lease was free, or the only write of that owner it read was
// already there at its first poll).
func (o *Ownership) PreviousOwnerAlive() (t time.Time, ok bool) {
	return o.prevAlive, !o.prevAlive.IsZero()
}

// ReportDependency is Manager.ReportDependency for this tenure only: a
// report that arrives after the tenure ended is ignored, so that late work
// of an old tenure cannot start or stop the clock of the next one.
func (o *Ownership) ReportDependency(healthy bool) {
	if o.m == nil {
		return
	}
	o.m.mu.Lock()
	defer o.m.mu.Unlock()
	if o.m.current != o {
		return
	}
	o.m.reportDependency(healthy)
}

func newOwnership(parent context.Context, tok Token, clock Clock, deadline time.Time) *Ownership {
	ctx, cancel := context.WithCancelCause(parent)
	o := &Ownership{token: tok, clock: clock, ctx: ctx, cancel: cancel, stopping: make(chan struct{})}
	o.deadline.Store(&deadline)
	o.mu.Lock()
	o.watchdog = time.AfterFunc(deadline.Sub(clock.Now()), o.expire)
	o.mu.Unlock()
	return o
}

// expire cancels the tenure if the local deadline has passed; a watchdog
// that fired early (a renew extended the deadline meanwhile) re-arms.
func (o *Ownership) expire() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if left := o.deadline.Load().Sub(o.clock.Now()); left > 0 {
		o.watchdog.Reset(left)
		return
	}
	o.cancel(ErrExpired)
}

// extend moves the local deadline to d after a successful renew. It
// reports false if the tenure already ended.
func (o *Ownership) extend(d time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ctx.Err() != nil {
		return false
	}
	if !o.clock.Now().Before(*o.deadline.Load()) {
		o.cancel(ErrExpired)
		return false
	}
	o.deadline.Store(&d)
	o.watchdog.Reset(d.Sub(o.clock.Now()))
	return true
}

func (o *Ownership) end(cause error) {
	o.stop()
	o.mu.Lock()
	o.watchdog.Stop()
	o.mu.Unlock()
	o.cancel(cause)
}

func (o *Ownership) stop() { o.stopOnce.Do(func() { close(o.stopping) }) }

// Token is the granted lease; Token().Version is the fencing token.
func (o *Ownership) Token() Token { return o.token }

// Context is cancelled when the tenure ends; context.Cause tells why.
func (o *Ownership) Context() context.Context { return o.ctx }

// Stopping is closed when the step-down starts.
func (o *Ownership) Stopping() <-chan struct{} { return o.stopping }

// Deadline is the current local deadline (a reading of the manager's Clock).
func (o *Ownership) Deadline() time.Time { return *o.deadline.Load() }

// Valid reports whether the owner may act right now: the tenure has not
// ended and the local deadline has not passed. Check it immediately before
// every externally visible action.
func (o *Ownership) Valid() bool {
	if o.ctx.Err() != nil {
		return false
	}
	return o.clock.Now().Before(*o.deadline.Load())
}
