package authlimit

import (
	"context"
	"crypto/sha256"
	"errors"
	"strconv"
	"sync"
	"time"
)

// ErrSlowedDown is the outcome of a check from a source that failed too
// often: either its check failed too (and was answered after the
// penalty), or it waited for its turn until its deadline. Send 429 with
// Retry-After.
var ErrSlowedDown = errors.New("too many failed authentications from this address; slow down")

// Guard slows down the guessing from a source without refusing a valid
// credential from the same source (a NAT, a load balancer in front of
// many clients).
//
// Below Limit failures per minute a source's checks run as they come.
// Above it, a source's checks run one at a time (its "slow lane"), and a
// failed one keeps the lane for Penalty before it is answered: a guesser
// behind that address gets at most one guess per Penalty, however many
// connections it opens, and costs at most one query per Penalty. A valid
// credential in the lane is answered as soon as its check is done.
//
// A credential that succeeded here within KnownFor skips the lane (it is
// still checked, so a revocation takes effect at once): the clients that
// were working keep working at full speed while others behind their
// address guess. A valid credential never seen before waits for its turn
// in the lane, at most until its request deadline; only then, with more
// guesses in flight than the deadline holds penalties, is it answered 429.
type Guard struct {
	failures *Limiter
	penalty  time.Duration
	knownFor time.Duration
	now      func() time.Time

	mu    sync.Mutex
	lanes map[string]*lane
	known map[[16]byte]time.Time
}

type lane struct {
	slot  chan struct{}
	users int
}

// maxKnown bounds the memory of the credentials that succeeded: about 50
// bytes each.
const maxKnown = 200_000

// NewGuard returns a guard allowing limit failures per source and minute
// before the slow lane, with the given penalty per failure in it.
func NewGuard(limit int64, penalty time.Duration) *Guard {
	return &Guard{failures: New(limit), penalty: penalty, knownFor: time.Hour, now: time.Now,
		lanes: map[string]*lane{}, known: map[[16]byte]time.Time{}}
}

// Penalty is the time a failed check in the slow lane holds it.
func (g *Guard) Penalty() time.Duration { return g.penalty }

// RetryAfter is the Retry-After value, in whole seconds (at least 1), of
// ErrSlowedDown.
func (g *Guard) RetryAfter() string {
	s := int64((g.penalty + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(s, 10)
}

// Slowed reports whether source is over its limit (its checks go through
// the slow lane).
func (g *Guard) Slowed(source string) bool { return g.failures.Blocked(source) }

// Check runs check for credential cred presented by source, within ctx.
// check reports ok, or an error when it could not decide (a database
// outage: not counted as a failure). The result is check's, except that
// a failed check, or one that never got its turn, from a source over its
// limit gives ErrSlowedDown. cred may be empty (nothing to remember).
func (g *Guard) Check(ctx context.Context, source, cred string, check func(context.Context) (bool, error)) (bool, error) {
	k, hasKey := keyOf(cred)
	if !g.failures.Blocked(source) || (hasKey && g.isKnown(k)) {
		ok, err := check(ctx)
		g.record(source, k, hasKey, ok, err)
		return ok, err
	}
	ln := g.enter(source)
	defer g.leave(source, ln)
	select {
	case ln.slot <- struct{}{}:
	case <-ctx.Done():
		return false, ErrSlowedDown
	}
	ok, err := check(ctx)
	g.record(source, k, hasKey, ok, err)
	if ok || err != nil {
		<-ln.slot
		return ok, err
	}
	// Not bound to ctx: a guesser that hangs up must not free the lane
	// sooner.
	time.Sleep(g.penalty)
	<-ln.slot
	return false, ErrSlowedDown
}

// Failed counts a failure of source found without a check (a malformed
// session cookie, say).
func (g *Guard) Failed(source string) { g.failures.Add(source) }

func keyOf(cred string) ([16]byte, bool) {
	if cred == "" {
		return [16]byte{}, false
	}
	h := sha256.Sum256([]byte(cred))
	return [16]byte(h[:16]), true
}

func (g *Guard) isKnown(k [16]byte) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	at, ok := g.known[k]
	return ok && g.now().Sub(at) < g.knownFor
}

func (g *Guard) record(source string, k [16]byte, hasKey, ok bool, err error) {
	switch {
	case err != nil:
	case ok && hasKey:
		g.mu.Lock()
		now := g.now()
		if len(g.known) >= maxKnown {
			for c, at := range g.known {
				if now.Sub(at) >= g.knownFor {
					delete(g.known, c)
				}
			}
		}
		if _, had := g.known[k]; had || len(g.known) < maxKnown {
			g.known[k] = now
		}
		g.mu.Unlock()
	case !ok:
		g.failures.Add(source)
		if hasKey {
			g.mu.Lock()
			delete(g.known, k)
			g.mu.Unlock()
		}
	}
}

func (g *Guard) enter(source string) *lane {
	g.mu.Lock()
	defer g.mu.Unlock()
	ln := g.lanes[source]
	if ln == nil {
		ln = &lane{slot: make(chan struct{}, 1)}
		g.lanes[source] = ln
	}
	ln.users++
	return ln
}

func (g *Guard) leave(source string, ln *lane) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ln.users--; ln.users == 0 {
		delete(g.lanes, source)
	}
}
