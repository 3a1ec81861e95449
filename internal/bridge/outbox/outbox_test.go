package outbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/spool"
	"github.com/myriarch/myriarch/internal/bridge/transport"
	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/pgstore"
)

// One PostgreSQL for the package's tests (each test has its own lease
// id): a cluster's start-up is the slow part on a loaded machine.
var (
	clusterOnce sync.Once
	cluster     *pgtest.Cluster
	clusterErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if cluster != nil {
		_ = cluster.Close()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func sharedCluster(t testing.TB) *pgtest.Cluster {
	t.Helper()
	clusterOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// MYRIARCH_OUTBOX_FSYNC=on measures with the WAL flushed at
		// each commit, as a production server does (pgtest's default is
		// fsync off).
		var settings map[string]string
		if v := os.Getenv("MYRIARCH_OUTBOX_FSYNC"); v != "" {
			settings = map[string]string{"fsync": v}
		}
		cluster, clusterErr = pgtest.Start(ctx, pgtest.Options{Settings: settings})
	})
	if errors.Is(clusterErr, pgtest.ErrNotInstalled) && os.Getenv("CI") != "true" {
		t.Skip(clusterErr)
	}
	if clusterErr != nil {
		t.Fatal(clusterErr)
	}
	return cluster
}

// The outbox is a routing.GroupSpool.
var _ routing.GroupSpool = (*Outbox)(nil)

type env struct {
	dsn   string
	pool  *pgxpool.Pool
	lease string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	dsn := sharedCluster(t).DSN("")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := OpenPool(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// A lease id of its own per run (-count=N shares the cluster).
	return &env{dsn: dsn, pool: pool, lease: fmt.Sprintf("plant/%s/%d", t.Name(), time.Now().UnixNano())}
}

// store opens a real PostgreSQL lease store on the env's database.
func (e *env) store(t testing.TB, clock lease.Clock) lease.Store {
	t.Helper()
	s, err := pgstore.OpenDSN(context.Background(), e.dsn, pgstore.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func (e *env) acquire(t testing.TB, s lease.Store, owner string) lease.Token {
	t.Helper()
	tok, err := s.Acquire(context.Background(), lease.Claim{ID: e.lease, Owner: owner, TTL: 5 * time.Second})
	if err != nil {
		t.Fatalf("acquire as %s: %v", owner, err)
	}
	return tok
}

func (e *env) open(t testing.TB, tok lease.Token, o Options) *Outbox {
	t.Helper()
	o.Pool, o.Lease, o.Route, o.Owner, o.Version = e.pool, e.lease, "r1", tok.Owner, tok.Version
	if o.MaxMessages == 0 && o.MaxBytes == 0 {
		o.MaxMessages = 1 << 20
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ob, err := Open(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ob.Close() })
	return ob
}

func (e *env) rows(t testing.TB) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+Table+" WHERE lease_id = $1", e.lease).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func msg(i int) *transport.Message {
	return &transport.Message{Topic: fmt.Sprintf("t/%d", i%3), Payload: []byte(fmt.Sprintf("m%d", i)), QoS: byte(i % 3), Retain: i%5 == 0,
		Received: time.Unix(1000+int64(i), 0)}
}

func appendN(t *testing.T, o *Outbox, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := o.Append(msg(i), nil); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
}

// next reads one row with a bounded wait.
func next(t *testing.T, o *Outbox) (uint64, *transport.Message) {
	t.Helper()
	quit := make(chan struct{})
	timer := time.AfterFunc(10*time.Second, func() { close(quit) })
	defer timer.Stop()
	seq, m, ok, err := o.Next(quit)
	if err != nil || !ok {
		t.Fatalf("next: ok %v err %v", ok, err)
	}
	return seq, m
}

func attach(t *testing.T, o *Outbox) {
	t.Helper()
	if !o.Attach(nil) {
		t.Fatal("attach refused")
	}
}

func TestAppendClaimAckInOrder(t *testing.T) {
	e := newEnv(t)
	tok := e.acquire(t, e.store(t, nil), "a#1")
	var reports atomic.Int64
	o := e.open(t, tok, Options{AckInterval: 10 * time.Millisecond, StatsInterval: 20 * time.Millisecond,
		OnStats: func(spool.Stats) { reports.Add(1) }})
	props := &sender.Properties{ContentType: "text/plain", User: []sender.UserProperty{{Key: "k", Value: "v"}}}
	m0 := msg(0)
	m0.Properties = props
	if err := o.Append(m0, nil); err != nil {
		t.Fatal(err)
	}
	appendN(t, o, 1, 600) // more than two claim batches
	if st := o.Stats(); st.Messages != 600 || st.Bytes <= 600*rowOverhead || st.PeakMessages != 600 {
		t.Fatalf("stats after appends: %+v", st)
	}
	attach(t, o)
	for i := range 600 {
		seq, m := next(t, o)
		want := msg(i)
		if i == 0 {
			want.Properties = props
		}
		if seq != uint64(i+1) || m.Topic != want.Topic || string(m.Payload) != string(want.Payload) || m.QoS != want.QoS ||
			m.Retain != want.Retain || !m.Received.Equal(want.Received) || fmt.Sprint(m.Properties) != fmt.Sprint(want.Properties) {
			t.Fatalf("row %d: seq %d %+v, want %+v", i, seq, m, want)
		}
		o.Ack(seq)
	}
	if st := o.Stats(); st.Messages != 0 || st.Bytes != 0 {
		t.Fatalf("stats after acks: %+v", st)
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.rows(t) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("settled rows not deleted: %d left", e.rows(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
	for reports.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if reports.Load() == 0 {
		t.Fatal("OnStats never called")
	}
	// Appended after the reader caught up: handed out as they come.
	appendN(t, o, 600, 602)
	if seq, m := next(t, o); seq != 601 || string(m.Payload) != "m600" {
		t.Fatalf("late row: %d %s", seq, m.Payload)
	}
}

// A restart (a new Outbox for the same tenure, or the next tenure)
// continues from the first row not deleted; a reader that detached hands
// what it did not settle to the next, and skips what it settled.
func TestRestartAndDetachContinue(t *testing.T) {
	e := newEnv(t)
	tok := e.acquire(t, e.store(t, nil), "a#1")
	o := e.open(t, tok, Options{AckInterval: time.Hour})
	appendN(t, o, 0, 10)
	attach(t, o)
	s1, _ := next(t, o)
	s2, _ := next(t, o)
	s3, _ := next(t, o)
	o.Ack(s2)
	o.Detach()
	attach(t, o)
	for _, want := range []uint64{s1, s3, 4, 5} {
		if seq, _ := next(t, o); seq != want {
			t.Fatalf("after detach: seq %d, want %d", seq, want)
		}
		o.Ack(want)
	}
	// Close deletes what was settled (1..5); 6..10 stay.
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if n := e.rows(t); n != 5 {
		t.Fatalf("rows after close: %d, want 5", n)
	}
	o2 := e.open(t, tok, Options{})
	if st := o2.Stats(); st.Recovered != 5 || st.Messages != 5 {
		t.Fatalf("reopened: %+v", st)
	}
	attach(t, o2)
	for i := 5; i < 10; i++ {
		if seq, m := next(t, o2); seq != uint64(i+1) || string(m.Payload) != fmt.Sprintf("m%d", i) {
			t.Fatalf("reopened row: seq %d %s, want %d", seq, m.Payload, i+1)
		}
	}
	// New appends continue the sequence.
	appendN(t, o2, 10, 11)
	if seq, _ := next(t, o2); seq != 11 {
		t.Fatalf("append after reopen: seq %d, want 11", seq)
	}
}

func TestFullBlockWaitsForRoom(t *testing.T) {
	e := newEnv(t)
	tok := e.acquire(t, e.store(t, nil), "a#1")
	o := e.open(t, tok, Options{MaxMessages: 3, Full: spool.FullBlock})
	appendN(t, o, 0, 3)
	done := make(chan error, 1)
	go func() { done <- o.Append(msg(3), nil) }()
	select {
	case err := <-done:
		t.Fatalf("append to a full outbox returned %v instead of waiting", err)
	case <-time.After(200 * time.Millisecond):
	}
	attach(t, o)
	seq, _ := next(t, o)
	o.Ack(seq)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("append still blocked after an ack made room")
	}
	// quit ends the wait with ErrClosed, and the message is not stored.
	quit := make(chan struct{})
	go func() { done <- o.Append(msg(4), quit) }()
	close(quit)
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("quit while full: %v", err)
	}
	if st := o.Stats(); st.Messages != 3 {
		t.Fatalf("held %d, want 3 (the settled one out, the quit one never in)", st.Messages)
	}
}

func TestFullDeadLetter(t *testing.T) {
	e := newEnv(t)
	tok := e.acquire(t, e.store(t, nil), "a#1")
	o := e.open(t, tok, Options{MaxMessages: 2, Full: spool.FullDeadLetter})
	appendN(t, o, 0, 2)
	if err := o.Append(msg(2), nil); !errors.Is(err, routing.ErrSpoolFull) {
		t.Fatalf("third append: %v, want ErrSpoolFull", err)
	}
	if n := e.rows(t); n != 2 {
		t.Fatalf("rows: %d, want 2 (the refused one is not stored)", n)
	}
	// A byte bound: one row fits, the next does not.
	o.Close()
	tok2 := lease.Token{Owner: tok.Owner, Version: tok.Version}
	_, err := e.pool.Exec(context.Background(), "DELETE FROM "+Table+" WHERE lease_id = $1", e.lease)
	if err != nil {
		t.Fatal(err)
	}
	ob := e.open(t, tok2, Options{MaxBytes: 100, Full: spool.FullDeadLetter})
	if err := ob.Append(&transport.Message{Topic: "t", Payload: make([]byte, 30)}, nil); err != nil {
		t.Fatal(err)
	}
	if err := ob.Append(&transport.Message{Topic: "t", Payload: make([]byte, 30)}, nil); !errors.Is(err, ErrFull) {
		t.Fatalf("over max_bytes: %v", err)
	}
}

// THE race: owner A holds version v and keeps appending, claiming and
// settling while B takes the lease over (v+1) — A frozen past its TTL as
// B's clock sees it, and A's own guard not consulted (the case of a
// clock that lied to it) — and opens the outbox, as its tenure does
// first. After that every Append, claim and acknowledgment of A is
// refused with ErrFenced, nothing of A's is lost or deleted, and B
// delivers, in order, every row that A's Append reported stored.
func TestDeposedOwnerIsFenced(t *testing.T) {
	e := newEnv(t)
	storeA := e.store(t, nil)
	clockB := &lease.JumpClock{}
	storeB := e.store(t, clockB)
	tokA := e.acquire(t, storeA, "a#1")

	var fencedCalls atomic.Int64
	a := e.open(t, tokA, Options{AckInterval: time.Hour, OnFenced: func(error) { fencedCalls.Add(1) }})
	appendN(t, a, 0, 20)
	attach(t, a)
	// A settles 1..5 and deletes them before the takeover (Close-free:
	// the flush the loop would do).
	for range 5 {
		seq, _ := next(t, a)
		a.Ack(seq)
	}
	if err := a.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A claims 6 and 7 (buffered, handed out) before the takeover.
	s6, _ := next(t, a)
	s7, _ := next(t, a)

	// A's appender runs on while B takes over.
	var mu sync.Mutex
	var stored []string
	var appendErr error
	stop := make(chan struct{})
	appender := make(chan struct{})
	go func() {
		defer close(appender)
		for i := 20; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			m := msg(i)
			if err := a.Append(m, nil); err != nil {
				mu.Lock()
				appendErr = err
				mu.Unlock()
				return
			}
			mu.Lock()
			stored = append(stored, string(m.Payload))
			mu.Unlock()
		}
	}()
	time.Sleep(50 * time.Millisecond) // some appends before the takeover
	// B observes A, A stays silent for its TTL by B's clock, B takes over.
	if _, err := storeB.Acquire(context.Background(), lease.Claim{ID: e.lease, Owner: "b#1", TTL: 5 * time.Second}); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("B's first acquire: %v, want ErrHeld", err)
	}
	clockB.Jump(10 * time.Second)
	tokB := e.acquire(t, storeB, "b#1")
	if tokB.Version != tokA.Version+1 {
		t.Fatalf("B's version %d, A's %d", tokB.Version, tokA.Version)
	}
	b := e.open(t, tokB, Options{})
	select {
	case <-appender:
	case <-time.After(10 * time.Second):
		close(stop)
		<-appender
		t.Fatal("A's appender was never refused after the takeover")
	}
	mu.Lock()
	if !errors.Is(appendErr, ErrFenced) {
		t.Fatalf("A's append after the takeover: %v, want ErrFenced", appendErr)
	}
	t.Logf("A stored %d appends while B took over; then: %v", len(stored), appendErr)
	mu.Unlock()
	// Everything after: refused.
	if err := a.Append(msg(9999), nil); !errors.Is(err, ErrFenced) {
		t.Fatalf("A append: %v", err)
	}
	a.Ack(s6)
	a.Ack(s7)
	if err := a.flush(context.Background()); err != nil && !errors.Is(err, ErrFenced) {
		t.Fatal(err)
	}
	if _, _, _, err := a.Next(nil); !errors.Is(err, ErrFenced) {
		t.Fatalf("A next: %v", err)
	}
	if fencedCalls.Load() != 1 {
		t.Fatalf("OnFenced called %d times, want 1", fencedCalls.Load())
	}
	// A second Outbox of A's tenure that has not found out yet: its
	// open and its claim are refused too.
	ctx := context.Background()
	if _, err := Open(ctx, Options{Pool: e.pool, Lease: e.lease, Route: "r1", Owner: tokA.Owner, Version: tokA.Version}); !errors.Is(err, ErrFenced) {
		t.Fatalf("A open after takeover: %v", err)
	}
	a2 := &Outbox{opts: Options{Pool: e.pool, Lease: e.lease, Route: "r1", Owner: tokA.Owner, Version: tokA.Version, Logger: a.opts.Logger},
		changed: make(chan struct{}), log: a.log}
	if _, err := a2.claim(nil, 1); !errors.Is(err, ErrFenced) {
		t.Fatalf("A claim after takeover: %v", err)
	}

	// B: rows 6.. (including 6 and 7, which A claimed and settled too
	// late), then every append A reported stored, in order.
	want := []string{}
	for i := 5; i < 20; i++ {
		want = append(want, fmt.Sprintf("m%d", i))
	}
	want = append(want, stored...)
	if n := e.rows(t); n != len(want) {
		t.Fatalf("rows after the takeover: %d, want %d (nothing lost, nothing deleted by A)", n, len(want))
	}
	if st := b.Stats(); st.Recovered != int64(len(want)) {
		t.Fatalf("B recovered %d, want %d", st.Recovered, len(want))
	}
	attach(t, b)
	for i, w := range want {
		seq, m := next(t, b)
		if string(m.Payload) != w {
			t.Fatalf("B row %d (seq %d): %s, want %s", i, seq, m.Payload, w)
		}
		b.Ack(seq)
	}
	if err := b.Append(msg(10000), nil); err != nil {
		t.Fatalf("B append: %v", err)
	}
	if _, m := next(t, b); string(m.Payload) != "m10000" {
		t.Fatalf("B's own append: %s", m.Payload)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("A close: %v", err)
	}
}

// The tenure's own guard (its local lease deadline) refuses before any
// successor opened the outbox: what the deposed owner still holds stays.
func TestTenureGuardRefuses(t *testing.T) {
	e := newEnv(t)
	tok := e.acquire(t, e.store(t, nil), "a#1")
	var valid atomic.Bool
	valid.Store(true)
	o := e.open(t, tok, Options{Valid: valid.Load})
	appendN(t, o, 0, 2)
	attach(t, o)
	seq, _ := next(t, o)
	valid.Store(false)
	o.Ack(seq)
	if err := o.flush(context.Background()); !errors.Is(err, ErrFenced) || !errors.Is(err, ErrTenureEnded) {
		t.Fatalf("delete after the deadline: %v, want ErrFenced and ErrTenureEnded", err)
	}
	if err := o.Append(msg(2), nil); !errors.Is(err, ErrFenced) {
		t.Fatalf("append after the deadline: %v", err)
	}
	if _, _, _, err := o.Next(nil); !errors.Is(err, ErrFenced) {
		t.Fatalf("next after the deadline: %v", err)
	}
	if n := e.rows(t); n != 2 {
		t.Fatalf("rows: %d, want 2 (nothing added, nothing deleted)", n)
	}
}

// The fence only rises: an older version cannot open the outbox after a
// newer one did, and the same tenure may open it again (another route, a
// reopen).
func TestFenceOnlyRises(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	open := func(owner string, v int64) error {
		o, err := Open(ctx, Options{Pool: e.pool, Lease: e.lease, Route: "r1", Owner: owner, Version: v})
		if err == nil {
			err = o.Close()
		}
		return err
	}
	if err := open("b#1", 7); err != nil {
		t.Fatal(err)
	}
	if err := open("b#1", 7); err != nil {
		t.Fatalf("the same tenure again: %v", err)
	}
	if err := open("a#1", 6); !errors.Is(err, ErrFenced) {
		t.Fatalf("an older version: %v", err)
	} else if !strings.Contains(err.Error(), `was taken over by b#1@v7`) {
		t.Fatalf("the error does not name the holder: %v", err)
	}
	if err := open("c#1", 7); !errors.Is(err, ErrFenced) {
		t.Fatalf("another owner at the same version: %v", err)
	}
	if err := open("c#1", 8); err != nil {
		t.Fatalf("a newer version: %v", err)
	}
}

func TestOpenRefusesBadOptions(t *testing.T) {
	if _, err := Open(context.Background(), Options{}); err == nil {
		t.Fatal("empty options accepted")
	}
}

// An INSERT whose statement failed after its commit (the connection lost
// with the reply) leaves rows the Outbox did not count (here a batch of
// two): the next batch moves past them instead of failing on the reused
// seqs forever, and the reader delivers them all.
func TestAppendAfterUnknownOutcome(t *testing.T) {
	e := newEnv(t)
	tok := e.acquire(t, e.store(t, nil), "a#1")
	o := e.open(t, tok, Options{})
	appendN(t, o, 0, 1)
	// The rows of the lost reply: committed at the next seqs.
	for _, i := range []int{1, 2} {
		if _, err := e.pool.Exec(context.Background(), `INSERT INTO `+Table+` (lease_id, route, seq, version, received_ns, qos, retain, topic, payload, size)
		VALUES ($1, 'r1', $2, $3, 0, 1, false, 't/1', $4, 52)`, e.lease, i+1, tok.Version, fmt.Sprintf("m%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	o.mu.Lock()
	o.resync = true
	o.mu.Unlock()
	if err := o.Append(msg(3), nil); err != nil {
		t.Fatalf("append after an unknown outcome: %v", err)
	}
	if st := o.Stats(); st.Messages != 4 {
		t.Fatalf("held %d, want 4", st.Messages)
	}
	attach(t, o)
	for i := range 4 {
		if seq, m := next(t, o); seq != uint64(i+1) || string(m.Payload) != fmt.Sprintf("m%d", i) {
			t.Fatalf("row %d: seq %d %s", i, seq, m.Payload)
		}
	}
}
