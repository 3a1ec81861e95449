// Package rowstore implements the lease.Store contract once, on top of a
// small compare-and-set Backend that each concrete store provides
// (SQLite, PostgreSQL, etcd). All of the protocol lives here: fencing
// versions, takeover by observation, the observation sequence, corrupt-row
// checks and the owner's local deadline.
package rowstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/myriarch/myriarch/lease"
)

// Row is the persisted state of one lease.
type Row struct {
	Owner string
	// Version is the fencing version of the current or last owner (≥ 1).
	Version int64
	// RenewedAtNS and ExpiryNS are the owner's wall clock (Unix ns) at its
	// last grant or renew and that plus its TTL. Only the difference is
	// used by other hosts.
	RenewedAtNS int64
	ExpiryNS    int64
	Endpoint    string
	// ObsSeq advances on every write of the row.
	ObsSeq int64
	// ObsElapsedNS is the observed silent time accumulated by standbys
	// since the owner's last renew.
	ObsElapsedNS int64
}

// Columns are the columns of a row in the SQL backends' myriarch_leases
// table, in the order of Row.Fields and Row.Values.
const Columns = "owner, version, renewed_at_ns, expiry_ns, endpoint, obs_seq, obs_elapsed_ns"

// Fields are pointers to r's fields in the order of Columns: what a
// SELECT of Columns scans into.
func (r *Row) Fields() []any {
	return []any{&r.Owner, &r.Version, &r.RenewedAtNS, &r.ExpiryNS, &r.Endpoint, &r.ObsSeq, &r.ObsElapsedNS}
}

// Values are r's fields in the order of Columns, followed by more: the
// arguments of an INSERT or UPDATE of Columns.
func (r Row) Values(more ...any) []any {
	return append([]any{r.Owner, r.Version, r.RenewedAtNS, r.ExpiryNS, r.Endpoint, r.ObsSeq, r.ObsElapsedNS}, more...)
}

// Scan is the Load of an SQL backend: scan is the Scan of a query for the
// Columns of row id, noRows the driver's error for no row (found false);
// another error is wrapped with the backend's name. The revision is the
// row's ObsSeq.
func Scan(scan func(dest ...any) error, noRows error, backend, id string) (row Row, rev int64, found bool, err error) {
	var r Row
	err = scan(r.Fields()...)
	if errors.Is(err, noRows) {
		return Row{}, 0, false, nil
	}
	if err != nil {
		return Row{}, 0, false, fmt.Errorf("%s: load %q: %w", backend, id, err)
	}
	return r, r.ObsSeq, true, nil
}

// Backend is a table of rows with compare-and-set writes. Every method is
// one store operation (one statement, one transaction or one etcd txn).
type Backend interface {
	// Load returns the row of id and its revision; found is false when the
	// row does not exist. A row that cannot be decoded is a
	// *lease.CorruptError.
	Load(ctx context.Context, id string) (row Row, rev int64, found bool, err error)
	// Insert creates the row of id; ok is false when it already exists.
	Insert(ctx context.Context, id string, row Row) (ok bool, err error)
	// CAS replaces the row of id if its revision is still rev; ok is
	// false otherwise.
	CAS(ctx context.Context, id string, rev int64, row Row) (ok bool, err error)
	// Close releases the backend's resources.
	Close() error
}

// Store implements lease.Store on a Backend.
type Store struct {
	b     Backend
	clock lease.Clock
	hub   *Hub // nil when b is not a Watcher

	mu   sync.Mutex
	obs  map[obsKey]observation
	held map[lease.Token]heldLease
}

type obsKey struct{ id, owner string }

// observation is an observer's baseline: a monotonic reading taken after a
// successful response, and the row's sequence number in that response.
type observation struct {
	base    time.Time
	seq     int64
	version int64
}

type heldLease struct {
	id       string
	deadline time.Time
}

// New returns a Store on b; clock nil means lease.SystemClock.
func New(b Backend, clock lease.Clock) *Store {
	if clock == nil {
		clock = lease.SystemClock{}
	}
	s := &Store{b: b, clock: clock, obs: map[obsKey]observation{}, held: map[lease.Token]heldLease{}}
	if w, ok := b.(Watcher); ok {
		s.hub = NewHub(w)
	}
	return s
}

// Backend returns the backend.
func (s *Store) Backend() Backend { return s.b }

// Close stops the release watch and closes the backend.
func (s *Store) Close() error {
	if s.hub != nil {
		s.hub.Close()
	}
	return s.b.Close()
}

// Check returns a *lease.CorruptError when row breaks an invariant.
func Check(id string, row Row) error {
	bad := func(format string, args ...any) error {
		return &lease.CorruptError{ID: id, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case row.Version < 1:
		return bad("version %d is not positive", row.Version)
	case row.ObsSeq < 0:
		return bad("observation sequence %d is negative", row.ObsSeq)
	case row.ObsElapsedNS < 0:
		return bad("observed elapsed %v is negative", time.Duration(row.ObsElapsedNS))
	case row.Owner != "" && row.ExpiryNS <= row.RenewedAtNS:
		return bad("expiry %d is not after renewed_at %d, so the required wait is not positive",
			row.ExpiryNS, row.RenewedAtNS)
	}
	return nil
}

func (s *Store) load(ctx context.Context, id string) (Row, int64, bool, error) {
	row, rev, found, err := s.b.Load(ctx, id)
	if err != nil {
		return Row{}, 0, false, err
	}
	if found {
		if err := Check(id, row); err != nil {
			return Row{}, 0, false, err
		}
	}
	return row, rev, found, nil
}

func addSat(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func (s *Store) grantRow(prev Row, c lease.Claim) Row {
	wall := s.clock.Now().UnixNano()
	return Row{Owner: c.Owner, Version: prev.Version + 1, RenewedAtNS: wall, ExpiryNS: addSat(wall, int64(c.TTL)),
		Endpoint: c.Endpoint, ObsSeq: prev.ObsSeq + 1}
}

func (s *Store) granted(c lease.Claim, row Row, pre time.Time) lease.Token {
	tok := lease.Token{Version: row.Version, Owner: c.Owner}
	s.mu.Lock()
	delete(s.obs, obsKey{c.ID, c.Owner})
	s.held[tok] = heldLease{id: c.ID, deadline: lease.LocalDeadline(pre, c.TTL)}
	s.mu.Unlock()
	return tok
}

func (s *Store) setBaseline(k obsKey, row Row) {
	s.mu.Lock()
	s.obs[k] = observation{base: s.clock.Now(), seq: row.ObsSeq, version: row.Version}
	s.mu.Unlock()
}

func (s *Store) forget(k obsKey) {
	s.mu.Lock()
	delete(s.obs, k)
	s.mu.Unlock()
}

func record(id string, row Row) lease.Record {
	r := lease.Record{ID: id, Owner: row.Owner, Version: row.Version, Endpoint: row.Endpoint,
		Observed: time.Duration(row.ObsElapsedNS), ObservationSeq: row.ObsSeq}
	if row.RenewedAtNS != 0 || row.ExpiryNS != 0 {
		r.RenewedAt = time.Unix(0, row.RenewedAtNS)
		r.Expiry = time.Unix(0, row.ExpiryNS)
	}
	return r
}

var errContention = fmt.Errorf("%w: another writer changed the row first (contention); observation re-baselined", lease.ErrHeld)

// Acquire implements lease.Store.
func (s *Store) Acquire(ctx context.Context, c lease.Claim) (lease.Token, error) {
	if c.ID == "" || c.Owner == "" || c.TTL <= 0 {
		return lease.Token{}, fmt.Errorf("lease: acquire needs an id, an owner and a positive TTL (got %q, %q, %v)", c.ID, c.Owner, c.TTL)
	}
	k := obsKey{c.ID, c.Owner}
	// The elapsed time of this observation is measured before the call is
	// sent, so latency after this point is never counted.
	sent := s.clock.Now()
	row, rev, found, err := s.load(ctx, c.ID)
	if err != nil {
		if errors.Is(err, lease.ErrCorrupt) {
			s.forget(k)
		}
		return lease.Token{}, err
	}
	if !found {
		nr := s.grantRow(Row{}, c)
		return s.grant(ctx, c, nr, sent, func() (bool, error) { return s.b.Insert(ctx, c.ID, nr) })
	}
	if row.Owner == "" || row.Owner == c.Owner {
		// Released, or our own: taken at once.
		nr := s.grantRow(row, c)
		return s.grant(ctx, c, nr, sent, func() (bool, error) { return s.b.CAS(ctx, c.ID, rev, nr) })
	}

	// Held by another owner: observe.
	s.mu.Lock()
	ob, have := s.obs[k]
	s.mu.Unlock()
	if !have || ob.seq != row.ObsSeq || ob.version != row.Version {
		// First observation, or someone wrote since our baseline: our
		// interval (if any) is discarded; this response is the baseline.
		s.setBaseline(k, row)
		return lease.Token{}, &lease.HeldError{Record: record(c.ID, row), Observed: time.Duration(row.ObsElapsedNS)}
	}
	elapsed := max(0, int64(sent.Sub(ob.base)))
	total := addSat(row.ObsElapsedNS, elapsed)
	wait := row.ExpiryNS - row.RenewedAtNS
	var nr Row
	if total >= wait {
		nr = s.grantRow(row, c)
	} else {
		nr = row
		nr.ObsElapsedNS = total
		nr.ObsSeq++
	}
	ok, err := s.b.CAS(ctx, c.ID, rev, nr)
	if err != nil {
		// Unknown outcome: start over with a new baseline next time.
		s.forget(k)
		return lease.Token{}, err
	}
	if !ok {
		return lease.Token{}, s.rebaseline(ctx, c)
	}
	if nr.Owner == c.Owner {
		return s.granted(c, nr, sent), nil
	}
	s.setBaseline(k, nr)
	return lease.Token{}, &lease.HeldError{Record: record(c.ID, nr), Observed: time.Duration(total)}
}

// grant writes nr, a row that grants c the lease, with write (an insert
// or a compare-and-set): the token when it is written; after an unknown
// outcome the baseline is forgotten and the error returned; after a lost
// race a new baseline is taken (rebaseline).
func (s *Store) grant(ctx context.Context, c lease.Claim, nr Row, sent time.Time, write func() (bool, error)) (lease.Token, error) {
	ok, err := write()
	if err != nil {
		s.forget(obsKey{c.ID, c.Owner})
		return lease.Token{}, err
	}
	if ok {
		return s.granted(c, nr, sent), nil
	}
	return lease.Token{}, s.rebaseline(ctx, c)
}

// rebaseline reads the row after a lost compare-and-set and takes a new
// baseline from that response. The Acquire reports contention (ErrHeld);
// the caller tries again after its poll.
func (s *Store) rebaseline(ctx context.Context, c lease.Claim) error {
	k := obsKey{c.ID, c.Owner}
	row, _, found, err := s.load(ctx, c.ID)
	if err != nil {
		s.forget(k)
		return err
	}
	if !found {
		s.forget(k)
		return errContention
	}
	s.setBaseline(k, row)
	if row.Owner != "" && row.Owner != c.Owner {
		return &lease.HeldError{Record: record(c.ID, row), Observed: time.Duration(row.ObsElapsedNS)}
	}
	return errContention
}

// loadHeld reads lease id's row for a holder of tok: a token that no
// longer holds the lease is forgotten, and the error is ErrLost.
func (s *Store) loadHeld(ctx context.Context, id string, tok lease.Token) (Row, int64, error) {
	row, rev, found, err := s.load(ctx, id)
	if err != nil {
		return Row{}, 0, err
	}
	if err := s.checkToken(id, row, found, tok); err != nil {
		s.drop(tok)
		return Row{}, 0, err
	}
	return row, rev, nil
}

func (s *Store) checkToken(id string, row Row, found bool, tok lease.Token) error {
	if !found || row.Owner != tok.Owner || row.Version != tok.Version {
		who := "no row"
		if found {
			who = fmt.Sprintf("the row names %q v%d", row.Owner, row.Version)
			if row.Owner == "" {
				who = fmt.Sprintf("the row was released at v%d", row.Version)
			}
		}
		return fmt.Errorf("lease %q: token %v: %w (%s)", id, tok, lease.ErrLost, who)
	}
	return nil
}

// maxCASRetries bounds how often Renew and Release retry a compare-and-set
// that lost against an observer's write.
const maxCASRetries = 8

// Renew implements lease.Store.
func (s *Store) Renew(ctx context.Context, id string, tok lease.Token, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("lease: renew needs a positive TTL (got %v)", ttl)
	}
	pre := s.clock.Now()
	s.mu.Lock()
	h, known := s.held[tok]
	s.mu.Unlock()
	if known && !pre.Before(h.deadline) {
		// The entry stays: an expired lease is never revived.
		return fmt.Errorf("lease %q: token %v: %w: its local deadline passed %v ago", id, tok, lease.ErrExpired, pre.Sub(h.deadline))
	}
	err := s.casHeld(ctx, id, tok, "renew", func(row Row) (Row, error) {
		if row.ObsElapsedNS >= row.ExpiryNS-row.RenewedAtNS {
			s.expire(tok, id)
			return Row{}, fmt.Errorf("lease %q: token %v: %w: standbys observed it silent for %v", id, tok, lease.ErrExpired, time.Duration(row.ObsElapsedNS))
		}
		nr := row
		wall := s.clock.Now().UnixNano()
		nr.RenewedAtNS, nr.ExpiryNS = wall, addSat(wall, int64(ttl))
		nr.ObsSeq++
		nr.ObsElapsedNS = 0
		return nr, nil
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.held[tok] = heldLease{id: id, deadline: lease.LocalDeadline(pre, ttl)}
	s.mu.Unlock()
	return nil
}

// casHeld replaces the row of lease id that tok holds with next(row) by
// compare-and-set, reading the row again after each lost race (an
// observer's write), at most maxCASRetries times; an error of next ends
// it. what names the operation in the error of too many lost races.
func (s *Store) casHeld(ctx context.Context, id string, tok lease.Token, what string, next func(Row) (Row, error)) error {
	for range maxCASRetries {
		row, rev, err := s.loadHeld(ctx, id, tok)
		if err != nil {
			return err
		}
		nr, err := next(row)
		if err != nil {
			return err
		}
		ok, err := s.b.CAS(ctx, id, rev, nr)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return fmt.Errorf("lease %q: %s lost %d compare-and-set races in a row", id, what, maxCASRetries)
}

func (s *Store) expire(tok lease.Token, id string) {
	s.mu.Lock()
	s.held[tok] = heldLease{id: id} // zero deadline: always passed
	s.mu.Unlock()
}

func (s *Store) drop(tok lease.Token) {
	s.mu.Lock()
	delete(s.held, tok)
	s.mu.Unlock()
}

// Release implements lease.Store.
func (s *Store) Release(ctx context.Context, id string, tok lease.Token) error {
	err := s.casHeld(ctx, id, tok, "release", func(row Row) (Row, error) {
		nr := row
		wall := s.clock.Now().UnixNano()
		nr.Owner, nr.Endpoint = "", ""
		nr.RenewedAtNS, nr.ExpiryNS = wall, wall
		nr.ObsSeq++
		nr.ObsElapsedNS = 0
		return nr, nil
	})
	if err != nil {
		return err
	}
	s.drop(tok)
	return nil
}

// Current implements lease.Store.
func (s *Store) Current(ctx context.Context, id string) (lease.Record, error) {
	row, _, found, err := s.load(ctx, id)
	if err != nil {
		return lease.Record{}, err
	}
	if !found {
		return lease.Record{ID: id}, nil
	}
	return record(id, row), nil
}
