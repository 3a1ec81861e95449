// Package lease makes one process the owner of an exclusive session and
// keeps it honest.
//
// A [Store] holds one row per session: the owner, a fencing version, the
// owner's own renew record (renewed_at and expiry, written with the owner's
// clock) and an observation record that standbys advance. A [Manager] runs
// the acquire/renew/step-down/release loop of one session on top of a Store,
// with the timings of a [failover.Cadence], so that its behaviour matches the
// terms of the failover budgets one for one.
//
// # Fencing
//
// Every grant of a lease carries a [Token] whose Version is a fencing token:
// greater than zero, strictly increasing across every change of owner
// (including a re-acquire by the same owner and a take of a released row),
// never reused. The row of a session is never deleted, not even by expiry,
// so its version history cannot restart. Work done under a lease should carry
// the Version so that a downstream system can refuse a stale owner.
//
// # Takeover by observation
//
// Hosts' wall clocks are never compared. The time a standby must wait before
// it takes a lease held by another owner comes from that owner's own renew
// record (expiry − renewed_at, both written by the owner, so the difference
// is the TTL it asked for whatever its clock says). Standbys measure the
// passage of that time themselves, with their own monotonic clock:
//
//   - each Acquire call that finds the lease held remembers, after its
//     successful response, a monotonic baseline and the row's observation
//     sequence number;
//   - the next Acquire measures the elapsed time since that baseline before
//     it sends its first store operation, and adds it to the elapsed total
//     stored on the row by compare-and-set, which also advances the
//     sequence number;
//   - an observer whose baseline sequence is no longer the row's (another
//     observer or the owner wrote in between) discards its interval and
//     takes a new baseline, so two observers never count the same interval
//     twice;
//   - every owner renew resets the elapsed total and the sequence;
//   - the Acquire whose total reaches the required wait takes the lease in
//     the same call.
//
// Every counted interval therefore starts after the owner's last renew was
// sent, so the lease is taken no earlier than TTL after the owner's renew
// (pre-call) time, in observer time. A released row (empty owner) is taken at
// once, and an owner re-acquires its own row at once.
//
// # Clock assumption
//
// Monotonic clocks may run at different rates on different hosts. Myriarch
// assumes that no host's monotonic clock rate is off by more than
// [MaxClockRateError] (2.5 %) from real time, in either direction;
// NTP-disciplined clocks are off by parts per million, and NTP slews at most
// 0.05 %. The owner stops acting at its local deadline, which gives up
// [DeadlineMargin] (6 %) of the TTL:
//
//	local deadline = pre-call time + TTL × (1 − 6 %)   (owner's monotonic clock)
//
// With the owner's clock 2.5 % slow and a standby's 2.5 % fast, the owner's
// deadline falls at most 0.94/0.975 ≈ 0.9641·TTL of real time after its
// renew was sent, and the earliest takeover at least 1/1.025 ≈ 0.9756·TTL
// after it, so the owner always stops first, with more than [ActAllowance]
// (1 % of the TTL) to spare for the time between a validity check and the
// action it guards. Wall clock
// offsets (any size) play no part. The store's required wait stays the TTL
// itself, so the owner-death budget formula is unchanged; only the owner
// gives up 6 % of its lease. On Linux the owner's deadline runs on
// [BootClock] (CLOCK_BOOTTIME), which counts host suspend; standbys measure
// on the monotonic clock, which does not, so a suspend only ever delays a
// takeover or ends a tenure early.
package lease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// MaxClockRateError is the largest drift of any host's monotonic clock rate
// from real time that the lease protocol tolerates, in either direction.
const MaxClockRateError = 0.025

// ActAllowance is the share of the TTL left, even with both clocks at
// MaxClockRateError, between the owner's latest stop and a standby's
// earliest takeover: room for the time from a validity check to the action
// it guards (an encode and a write, or a goroutine descheduled right there
// on a saturated CPU): 450 ms at a 45 s TTL, 50 ms at the 5 s minimum.
const ActAllowance = 0.01

// DeadlineMargin is the share of the TTL an owner gives up: its local
// deadline is the pre-call time of its last successful Acquire or Renew plus
// TTL·(1 − DeadlineMargin). 2·MaxClockRateError covers clock rates,
// ActAllowance the check-to-act time.
const DeadlineMargin = 2*MaxClockRateError + ActAllowance

// LocalDeadline returns the owner's local deadline for a grant or renew of
// ttl whose call was sent at preCall (a monotonic reading).
func LocalDeadline(preCall time.Time, ttl time.Duration) time.Time {
	return preCall.Add(ttl - time.Duration(float64(ttl)*DeadlineMargin))
}

// Token is a granted lease. Version is the fencing token.
type Token struct {
	Version int64
	Owner   string
}

// IsZero reports whether t is the zero Token (no lease).
func (t Token) IsZero() bool { return t.Version == 0 && t.Owner == "" }

func (t Token) String() string { return fmt.Sprintf("%s@v%d", t.Owner, t.Version) }

// Claim is what an Acquire asks for.
type Claim struct {
	// ID names the session (the lease row).
	ID string
	// Owner is the owner id, conventionally OwnerID(instance).
	Owner string
	// TTL is the lease duration the owner asks for; observers wait this
	// long after its last renew before they take over.
	TTL time.Duration
	// Endpoint is the owner's advertised endpoint (optional), returned by
	// Current.
	Endpoint string
}

// Record is the state of a lease row as Current reports it.
type Record struct {
	ID string
	// Owner is empty when the lease was released (or never granted).
	Owner string
	// Version is the fencing version of the current or last owner; 0 when
	// the row does not exist.
	Version int64
	// RenewedAt and Expiry are the owner's own renew record, in the
	// owner's wall clock. Only their difference (the required wait) is
	// meaningful to other hosts.
	RenewedAt time.Time
	Expiry    time.Time
	// Endpoint is the owner's advertised endpoint.
	Endpoint string
	// Observed is the elapsed time standbys have accumulated since the
	// owner's last renew.
	Observed time.Duration
	// ObservationSeq advances on every write of the row.
	ObservationSeq int64
}

// Held reports whether the record names an owner.
func (r Record) Held() bool { return r.Owner != "" }

// RequiredWait is the wait the owner's renew record asks for.
func (r Record) RequiredWait() time.Duration { return r.Expiry.Sub(r.RenewedAt) }

// Store is a lease store. Implementations are safe for concurrent use by
// many goroutines and, where the backend allows, by many processes.
//
// The caller bounds each call with ctx; the Manager gives one whole Acquire
// (all of its internal store operations) one renew_call_timeout. A call
// should return as soon as its context ends. The Manager does not rely on
// it: it stops waiting for a call at its bound, treats the outcome as
// unknown (a transient error wrapping ErrCallAbandoned) and lets the call
// finish in the background, so a store that overruns its context cannot
// stretch a failover past its budget.
type Store interface {
	// Acquire grants the lease to c.Owner if the row is absent, released,
	// already held by c.Owner, or held by another owner that standbys have
	// observed silent for its required wait; the grant carries a new,
	// higher fencing version. Otherwise it records this call's observation
	// and returns an error wrapping ErrHeld (a *HeldError), which is also
	// what a call that lost a compare-and-set race to another writer
	// returns: contention, to be retried at the next poll.
	Acquire(ctx context.Context, c Claim) (Token, error)
	// Renew extends the lease of tok by ttl and resets the observation.
	// A stale or foreign token gets ErrLost; a lease whose local deadline
	// passed or that standbys observed expired gets ErrExpired and is
	// never revived.
	Renew(ctx context.Context, id string, tok Token, ttl time.Duration) error
	// Release gives the lease up: the row keeps its version and gets an
	// empty owner, so the next Acquire takes it at once with a higher
	// version. A stale or foreign token gets ErrLost.
	Release(ctx context.Context, id string, tok Token) error
	// Current reads the row. A missing row is a zero Record with no error.
	Current(ctx context.Context, id string) (Record, error)
	// Close releases the store's resources (not the leases).
	Close() error
}

// Errors of the Store contract. Test them with errors.Is; anything else a
// store returns is transient (the call may or may not have taken effect).
var (
	// ErrHeld: another owner holds the lease and has not been observed
	// silent for its required wait yet.
	ErrHeld = errors.New("lease: held by another owner")
	// ErrLost: the token is stale or foreign (the row names another owner
	// or version, or was released). Definitive.
	ErrLost = errors.New("lease: token is stale or foreign")
	// ErrExpired: the lease expired (local deadline passed, or standbys
	// observed it silent for its required wait). Definitive; Renew never
	// revives it.
	ErrExpired = errors.New("lease: expired")
	// ErrCorrupt: the row does not satisfy the store's invariants. The
	// store fails closed: it neither grants nor renews on such a row.
	ErrCorrupt = errors.New("lease: corrupt lease row")
	// ErrDependencyStepDown is returned by Manager.Run after the owner
	// stepped down because its dependency path stayed unhealthy for
	// Config.DependencyStepDown (see Manager.ReportDependency). The
	// manager does not compete again; the program decides what follows
	// (the bridge exits non-zero so its supervisor restarts it as a
	// standby).
	ErrDependencyStepDown = errors.New("lease: stepped down: dependency path unhealthy; the manager does not compete again")
)

// HeldError is the error of an Acquire that found the lease held. It wraps
// ErrHeld.
type HeldError struct {
	Record Record
	// Observed is the accumulated observation after this call.
	Observed time.Duration
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("lease %q: held by %s (v%d), observed silent %v of %v",
		e.Record.ID, e.Record.Owner, e.Record.Version, e.Observed, e.Record.RequiredWait())
}

// Unwrap makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Unwrap() error { return ErrHeld }

// CorruptError names the row and the broken invariant. It wraps ErrCorrupt.
type CorruptError struct {
	ID     string
	Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("lease %q: corrupt lease row: %s; refusing to grant or renew it (repair or delete the row by hand)", e.ID, e.Reason)
}

// Unwrap makes errors.Is(err, ErrCorrupt) true.
func (e *CorruptError) Unwrap() error { return ErrCorrupt }

// Definitive reports whether a Renew error means the lease is gone for
// good (ErrLost, ErrExpired, ErrCorrupt), as opposed to a transient failure.
func Definitive(err error) bool {
	return errors.Is(err, ErrLost) || errors.Is(err, ErrExpired) || errors.Is(err, ErrCorrupt)
}

// Clock supplies monotonic readings. Only differences between readings of
// one Clock are used; the wall part is written to rows for operators only.
// Tests inject skewed clocks. Implementations must be safe for concurrent
// use: Ownership.Valid reads the clock without any lock.
type Clock interface {
	Now() time.Time
}

// SystemClock is the host clock.
type SystemClock struct{}

// Now returns time.Now(), which carries a monotonic reading.
func (SystemClock) Now() time.Time { return time.Now() }
