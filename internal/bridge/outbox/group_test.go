package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/spool"
	"github.com/myriarch/myriarch/internal/testwait"
	"github.com/myriarch/myriarch/lease"
)

// The group-commit tests hold the committer in the middle of an INSERT
// with the real database: a transaction of the test's own takes the fence
// row FOR UPDATE, so that the INSERT's FOR SHARE of it waits, and what
// the test enqueues meanwhile queues up behind it. Nothing here depends
// on timing: each step waits for the state it needs (the INSERT waiting
// on the lock in pg_stat_activity, the verdicts reported).

const waitLimit = 30 * time.Second

// conn opens a connection of the test's own (not the outbox's pool,
// whose four connections the outbox uses).
func (e *env) conn(t *testing.T) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// fenceHold is the test's transaction holding the fence row of e's lease.
type fenceHold struct {
	tx   pgx.Tx
	done bool
}

func holdFence(t *testing.T, e *env) *fenceHold {
	t.Helper()
	c := e.conn(t)
	tx, err := c.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var one int
	if err := tx.QueryRow(context.Background(), "SELECT 1 FROM "+FenceTable+" WHERE lease_id = $1 FOR UPDATE", e.lease).Scan(&one); err != nil {
		t.Fatal(err)
	}
	h := &fenceHold{tx: tx}
	t.Cleanup(func() { h.end(t, false) })
	return h
}

// end commits (what the transaction changed takes effect) or rolls back.
func (h *fenceHold) end(t *testing.T, commit bool) {
	t.Helper()
	if h.done {
		return
	}
	h.done = true
	var err error
	if commit {
		err = h.tx.Commit(context.Background())
	} else {
		err = h.tx.Rollback(context.Background())
	}
	if err != nil {
		t.Fatal(err)
	}
}

// waitingInsert waits until the committer's INSERT waits for the fence
// row's lock that h holds, and returns its backend's pid.
func waitingInsert(t *testing.T, obs *pgx.Conn, h *fenceHold) int {
	t.Helper()
	var pid int
	holder := h.tx.Conn().PgConn().PID()
	testwait.Until(t, "the committer's INSERT waiting on the fence row", waitLimit, func() bool {
		err := obs.QueryRow(context.Background(), `SELECT pid FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%INSERT INTO `+Table+` (%' AND $1 = ANY (pg_blocking_pids(pid)) LIMIT 1`,
			int32(holder)).Scan(&pid)
		return err == nil
	})
	return pid
}

// verdicts records what the outbox reported, in the order reported.
type verdicts struct {
	mu  sync.Mutex
	got []verdict
}

type verdict struct {
	i   int
	err error
}

func (v *verdicts) of(i int) func(error) {
	return func(err error) {
		v.mu.Lock()
		v.got = append(v.got, verdict{i, err})
		v.mu.Unlock()
	}
}

func (v *verdicts) snapshot() []verdict {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.got)
}

func (v *verdicts) wait(t *testing.T, n int) []verdict {
	t.Helper()
	testwait.Until(t, fmt.Sprintf("%d verdicts", n), waitLimit, func() bool { return len(v.snapshot()) >= n })
	return v.snapshot()
}

func enqueue(t *testing.T, o *Outbox, i int, v *verdicts) {
	t.Helper()
	if err := o.Enqueue(msg(i), nil, v.of(i)); err != nil {
		t.Fatalf("enqueue %d: %v", i, err)
	}
}

// payloads are the payloads of e's rows in seq order.
func (e *env) payloads(t *testing.T) []string {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), "SELECT payload FROM "+Table+" WHERE lease_id = $1 ORDER BY seq", e.lease)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var b []byte
		err := r.Scan(&b)
		return string(b), err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// recorder is a sender that accepts everything and records the payloads
// in the order sent.
type recorder struct {
	mu  sync.Mutex
	got []string
}

func (r *recorder) Send(m *sender.Message, done func(error)) {
	r.mu.Lock()
	r.got = append(r.got, string(m.Payload))
	r.mu.Unlock()
	done(nil)
}

func (r *recorder) Close(context.Context) error { return nil }

func (r *recorder) sent() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// The route hands messages to the outbox without waiting for their
// commit: while one INSERT waits, the dispatcher (the session's packet
// loop) goes on taking messages; nothing is acknowledged before it is
// committed; everything that queued up meanwhile is one INSERT; the
// acknowledgments come in arrival order, and the pump delivers in order.
func TestGroupCommitThroughTheRoute(t *testing.T) {
	e := newEnv(t)
	tok := e.acquire(t, e.store(t, nil), "a#1")
	o := e.open(t, tok, Options{AckInterval: 10 * time.Millisecond})
	rec := &recorder{}
	r := routing.NewRoute(routing.RouteConfig{ID: "r1", Filters: []string{"#"}, MaxInFlight: 100, Spool: o,
		Targets: []routing.Target{{ID: "sink", Sender: rec, MaxAttempts: 1}}, Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(r.Close) // before the outbox's Close (cleanups run last first)
	d := &routing.Dispatcher{Session: "s", Routes: []*routing.Route{r}}
	var mu sync.Mutex
	var acked []int
	ack := func(i int) func() {
		return func() {
			mu.Lock()
			acked = append(acked, i)
			mu.Unlock()
		}
	}
	ackedNow := func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(acked)
	}
	obs := e.conn(t)
	h := holdFence(t, e)
	d.Handle(msg(0), ack(0))
	waitingInsert(t, obs, h)
	const n = 100
	for i := 1; i < n; i++ {
		d.Handle(msg(i), ack(i)) // returns: the INSERT of m0 still waits
	}
	if a := ackedNow(); len(a) != 0 {
		t.Fatalf("acknowledged before any commit: %v", a)
	}
	if rows := e.rows(t); rows != 0 {
		t.Fatalf("%d rows before the commit", rows)
	}
	if s := o.statements.Load(); s != 1 {
		t.Fatalf("%d INSERTs issued while the first waits, want 1", s)
	}
	h.end(t, false)
	testwait.Until(t, "every message acknowledged", waitLimit, func() bool { return len(ackedNow()) == n })
	for i, a := range ackedNow() {
		if a != i {
			t.Fatalf("acknowledgments out of order: %v", ackedNow())
		}
	}
	if s := o.statements.Load(); s != 2 {
		t.Fatalf("%d INSERTs for m0 and the 99 that queued behind it, want 2", s)
	}
	testwait.Until(t, "every message delivered", waitLimit, func() bool { return len(rec.sent()) == n })
	for i, p := range rec.sent() {
		if p != fmt.Sprintf("m%d", i) {
			t.Fatalf("delivered out of order at %d: %v", i, rec.sent())
		}
	}
	testwait.Until(t, "settled rows deleted", waitLimit, func() bool { return e.rows(t) == 0 })
}

// A batch that the fence refuses stores nothing and acknowledges
// nothing: every message in it, and every one queued behind it, stays
// unacknowledged; after it the outbox refuses at once.
func TestFencedBatchAcknowledgesNothing(t *testing.T) {
	e := newEnv(t)
	tok := e.acquire(t, e.store(t, nil), "a#1")
	var fencedCalls atomic.Int64
	o := e.open(t, tok, Options{OnFenced: func(error) { fencedCalls.Add(1) }})
	obs := e.conn(t)
	h := holdFence(t, e)
	v := &verdicts{}
	enqueue(t, o, 0, v)
	waitingInsert(t, obs, h)
	for i := 1; i < 10; i++ {
		enqueue(t, o, i, v)
	}
	// A successor takes the outbox over while the batch waits (what its
	// Open's upsert does), and commits: the waiting INSERT finds the fence
	// row changed.
	if _, err := h.tx.Exec(context.Background(), "UPDATE "+FenceTable+" SET version = version + 1, owner = 'b#1' WHERE lease_id = $1", e.lease); err != nil {
		t.Fatal(err)
	}
	h.end(t, true)
	got := v.wait(t, 10)
	for k, g := range got {
		if g.i != k || !errors.Is(g.err, ErrFenced) {
			t.Fatalf("verdict %d: message %d, %v; want message %d refused with ErrFenced", k, g.i, g.err, k)
		}
	}
	if rows := e.rows(t); rows != 0 {
		t.Fatalf("a fenced batch stored %d rows", rows)
	}
	if err := o.Enqueue(msg(10), nil, v.of(10)); !errors.Is(err, ErrFenced) {
		t.Fatalf("enqueue after the fence: %v", err)
	}
	if fencedCalls.Load() != 1 {
		t.Fatalf("OnFenced called %d times, want 1", fencedCalls.Load())
	}
}

// Close lets the INSERT in progress finish (its messages are stored and
// then acknowledged) and leaves what is queued behind it unstored and
// unacknowledged; an INSERT that outlasts the grace is cancelled and its
// messages stay unacknowledged. Either way nothing is acknowledged that
// the table does not hold.
func TestCloseLeavesQueuedUnacknowledged(t *testing.T) {
	for _, tc := range []struct {
		name    string
		grace   time.Duration
		release bool // the INSERT may finish within the grace
	}{{"in-progress commit finishes", 5 * time.Minute, true}, {"in-progress commit cancelled", 100 * time.Millisecond, false}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			tok := e.acquire(t, e.store(t, nil), "a#1")
			o := e.open(t, tok, Options{})
			o.closeGrace = tc.grace
			obs := e.conn(t)
			h := holdFence(t, e)
			v := &verdicts{}
			enqueue(t, o, 0, v)
			waitingInsert(t, obs, h)
			for i := 1; i < 10; i++ {
				enqueue(t, o, i, v)
			}
			closed := make(chan error, 1)
			go func() { closed <- o.Close() }()
			testwait.Until(t, "Close started", waitLimit, func() bool {
				o.mu.Lock()
				defer o.mu.Unlock()
				return o.closed
			})
			if tc.release {
				h.end(t, false)
			}
			select {
			case <-closed:
			case <-time.After(waitLimit):
				t.Fatal("Close did not return")
			}
			h.end(t, false)
			got := v.wait(t, 10)
			in := map[string]bool{}
			for _, p := range e.payloads(t) {
				in[p] = true
			}
			for k, g := range got {
				if g.i != k {
					t.Fatalf("verdicts out of order: %v", got)
				}
				if g.err == nil && !in[fmt.Sprintf("m%d", g.i)] {
					t.Fatalf("m%d acknowledged but not in the table", g.i)
				}
				if g.i > 0 && (!errors.Is(g.err, ErrClosed) || in[fmt.Sprintf("m%d", g.i)]) {
					t.Fatalf("m%d queued behind the INSERT at Close: %v, in the table %v; want ErrClosed and not stored", g.i, g.err, in[fmt.Sprintf("m%d", g.i)])
				}
			}
			if tc.release && got[0].err != nil {
				t.Fatalf("m0, whose INSERT finished within the grace: %v", got[0].err)
			}
			if !tc.release && got[0].err == nil {
				t.Fatal("m0 acknowledged although its INSERT was cancelled")
			}
			if err := o.Enqueue(msg(99), nil, v.of(99)); !errors.Is(err, ErrClosed) {
				t.Fatalf("enqueue after Close: %v", err)
			}
		})
	}
}

// An INSERT that fails (its connection ended under it) leaves its batch
// unacknowledged; the next batch finds where the rows end and is stored.
func TestFailedBatchStaysUnacknowledged(t *testing.T) {
	e := newEnv(t)
	tok := e.acquire(t, e.store(t, nil), "a#1")
	o := e.open(t, tok, Options{})
	obs := e.conn(t)
	h := holdFence(t, e)
	v := &verdicts{}
	enqueue(t, o, 0, v)
	enqueue(t, o, 1, v) // queued behind m0's INSERT, or in it
	pid := waitingInsert(t, obs, h)
	var first []verdict
	if _, err := obs.Exec(context.Background(), "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	first = v.wait(t, 1)
	if first[0].i != 0 || first[0].err == nil {
		t.Fatalf("the ended INSERT's first message: %+v, want m0 with an error", first[0])
	}
	for i := 2; i < 5; i++ {
		enqueue(t, o, i, v)
	}
	h.end(t, false)
	got := v.wait(t, 5)
	var stored []string
	for k, g := range got {
		if g.i != k {
			t.Fatalf("verdicts out of order: %v", got)
		}
		if g.err == nil {
			stored = append(stored, fmt.Sprintf("m%d", g.i))
		}
	}
	if !slices.Equal(e.payloads(t), stored) {
		t.Fatalf("rows %v, acknowledged %v", e.payloads(t), stored)
	}
	if len(stored) < 3 {
		t.Fatalf("stored %v; want at least m2..m4 after the failed INSERT", stored)
	}
	if st := o.Stats(); st.Messages != int64(len(stored)) {
		t.Fatalf("held %d, want %d", st.Messages, len(stored))
	}
}

// Messages that arrive while commits run keep their order (rows, the
// verdicts and what the reader hands out), and MaxPending bounds what is
// not yet reported: Enqueue waits beyond it.
func TestGroupCommitOrderAndBound(t *testing.T) {
	e := newEnv(t)
	tok := e.acquire(t, e.store(t, nil), "a#1")
	const maxPending, n = 16, 2000
	o := e.open(t, tok, Options{MaxPending: maxPending, AckInterval: 10 * time.Millisecond})
	v := &verdicts{}
	var reported atomic.Int64
	readErr := make(chan error, 1)
	attach(t, o)
	go func() {
		quit := make(chan struct{})
		timer := time.AfterFunc(2*time.Minute, func() { close(quit) })
		defer timer.Stop()
		for i := range n {
			seq, m, ok, err := o.Next(quit)
			if err != nil || !ok {
				readErr <- fmt.Errorf("next %d: ok %v, %v", i, ok, err)
				return
			}
			if string(m.Payload) != fmt.Sprintf("m%d", i) || seq != uint64(i+1) {
				readErr <- fmt.Errorf("read %d: seq %d %s", i, seq, m.Payload)
				return
			}
			o.Ack(seq)
		}
		readErr <- nil
	}()
	maxSeen := int64(0)
	for i := range n {
		rec := v.of(i)
		if err := o.Enqueue(msg(i), nil, func(err error) { rec(err); reported.Add(1) }); err != nil {
			t.Fatal(err)
		}
		maxSeen = max(maxSeen, int64(i+1)-reported.Load())
	}
	if maxSeen > maxPending {
		t.Fatalf("%d messages unreported at once, MaxPending %d", maxSeen, maxPending)
	}
	got := v.wait(t, n)
	for k, g := range got {
		if g.i != k || g.err != nil {
			t.Fatalf("verdict %d: message %d, %v", k, g.i, g.err)
		}
	}
	if err := <-readErr; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d messages in %d INSERTs (at most %d unreported at once)", n, o.statements.Load(), maxSeen)
}

// The full policy judges each message at Enqueue, counting what is
// queued: dead_letter refuses the ones beyond the bound (their verdict,
// ErrFull, in order with the others), block waits for room.
func TestGroupFullPolicy(t *testing.T) {
	t.Run("dead_letter", func(t *testing.T) {
		e := newEnv(t)
		tok := e.acquire(t, e.store(t, nil), "a#1")
		o := e.open(t, tok, Options{MaxMessages: 5, Full: spool.FullDeadLetter})
		obs := e.conn(t)
		h := holdFence(t, e)
		v := &verdicts{}
		enqueue(t, o, 0, v)
		waitingInsert(t, obs, h)
		for i := 1; i < 8; i++ {
			enqueue(t, o, i, v)
		}
		h.end(t, false)
		got := v.wait(t, 8)
		for k, g := range got {
			full := errors.Is(g.err, ErrFull)
			if g.i != k || (k < 5) == full || (k < 5 && g.err != nil) {
				t.Fatalf("verdict %d: message %d, %v (want m0..m4 stored, m5..m7 ErrFull)", k, g.i, g.err)
			}
		}
		if rows := e.rows(t); rows != 5 {
			t.Fatalf("rows %d, want 5", rows)
		}
	})
	t.Run("block", func(t *testing.T) {
		e := newEnv(t)
		tok := e.acquire(t, e.store(t, nil), "a#1")
		o := e.open(t, tok, Options{MaxMessages: 3})
		obs := e.conn(t)
		h := holdFence(t, e)
		v := &verdicts{}
		enqueue(t, o, 0, v)
		waitingInsert(t, obs, h)
		enqueue(t, o, 1, v)
		enqueue(t, o, 2, v)
		waited := make(chan error, 1)
		go func() { waited <- o.Enqueue(msg(3), nil, v.of(3)) }()
		h.end(t, false)
		v.wait(t, 3)
		select {
		case err := <-waited:
			t.Fatalf("enqueue into a full outbox returned %v instead of waiting", err)
		case <-time.After(100 * time.Millisecond):
		}
		attach(t, o)
		seq, _ := next(t, o)
		o.Ack(seq)
		if err := <-waited; err != nil {
			t.Fatal(err)
		}
		if got := v.wait(t, 4); got[3].i != 3 || got[3].err != nil {
			t.Fatalf("after room: %+v", got[3])
		}
	})
}

// The two-owner race with group commit: A's packet loop enqueues without
// waiting while B takes the outbox over. Every batch of A is stored whole
// or refused whole; no message is reported stored after one was refused;
// B holds exactly the messages A reported stored, in order.
func TestDeposedOwnerGroupsAreFenced(t *testing.T) {
	e := newEnv(t)
	storeA := e.store(t, nil)
	clockB := &lease.JumpClock{}
	storeB := e.store(t, clockB)
	tokA := e.acquire(t, storeA, "a#1")
	a := e.open(t, tokA, Options{})
	v := &verdicts{}
	stop := make(chan struct{})
	appender := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				appender <- nil
				return
			default:
			}
			if err := a.Enqueue(msg(i), nil, v.of(i)); err != nil {
				appender <- err
				return
			}
		}
	}()
	testwait.Until(t, "A storing", waitLimit, func() bool { return len(v.snapshot()) > 200 })
	if _, err := storeB.Acquire(context.Background(), lease.Claim{ID: e.lease, Owner: "b#1", TTL: 5 * time.Second}); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("B's first acquire: %v, want ErrHeld", err)
	}
	clockB.Jump(10 * time.Second)
	tokB := e.acquire(t, storeB, "b#1")
	b := e.open(t, tokB, Options{})
	var err error
	select {
	case err = <-appender:
	case <-time.After(waitLimit):
		close(stop)
		<-appender
		t.Fatal("A's Enqueue was never refused after the takeover")
	}
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("A's enqueue after the takeover: %v, want ErrFenced", err)
	}
	// Every verdict reported (A's committer reports what was queued).
	enqueued := 0
	testwait.Until(t, "A's verdicts", waitLimit, func() bool {
		got := v.snapshot()
		enqueued = len(got)
		return a.unreportedNow() == 0
	})
	got := v.snapshot()
	var stored []string
	refused := false
	for k, g := range got {
		if g.i != k {
			t.Fatalf("verdicts out of order at %d", k)
		}
		switch {
		case g.err == nil && refused:
			t.Fatalf("m%d reported stored after a refused one", g.i)
		case g.err == nil:
			stored = append(stored, fmt.Sprintf("m%d", g.i))
		case !errors.Is(g.err, ErrFenced):
			t.Fatalf("m%d: %v, want ErrFenced", g.i, g.err)
		default:
			refused = true
		}
	}
	if !slices.Equal(e.payloads(t), stored) {
		t.Fatalf("rows (%d) differ from what A reported stored (%d)", len(e.payloads(t)), len(stored))
	}
	if st := b.Stats(); st.Recovered != int64(len(stored)) {
		t.Fatalf("B recovered %d, want %d", st.Recovered, len(stored))
	}
	attach(t, b)
	for i, w := range stored {
		if _, m := next(t, b); string(m.Payload) != w {
			t.Fatalf("B row %d: %s, want %s", i, m.Payload, w)
		}
	}
	t.Logf("A enqueued %d: %d stored in %d INSERTs before the takeover, %d refused", enqueued, len(stored), a.statements.Load(), enqueued-len(stored))
}

// unreportedNow is what Enqueue took and the committer has not reported.
func (o *Outbox) unreportedNow() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.unreported
}
