// Package outbox is a route's durable spool on PostgreSQL, for the
// exclusive sessions of a cluster: the rows of the table
// myriarch_bridge_outbox, which this package alone owns (with its fence
// table myriarch_bridge_outbox_fence), in the database of the PostgreSQL
// lease store (lease/pgstore), so that every instance that may take the
// session over reaches it.
//
// It implements routing.Spool like the file spool (package spool): the
// route appends each received message before the source is acknowledged
// (the durability point is the INSERT's commit, with synchronous_commit
// on), its pump reads the rows in seq order (so in order per topic) and a
// row is deleted once the route settled it (every sender accepted it or
// it was dead-lettered). A successor that takes over the session's lease
// opens the same rows and continues from the first one not deleted.
//
// # Group commit
//
// A commit costs the database's WAL flush, milliseconds on a disk, and a
// route that waited for one commit per message would take in no more
// messages a second than one over that latency. So the route hands
// messages over without waiting (Enqueue, routing.GroupSpool) and one
// committer stores everything that queued up while its previous INSERT
// ran, in one fenced statement (INSERT ... SELECT ... FROM unnest of one
// array per column), then reports each message's verdict in queue order;
// the route acknowledges the source from there. The source's receive
// maximum bounds what is queued, and MaxPending too. A statement stores
// its whole batch or nothing: fenced, every message of the batch is
// refused and stays unacknowledged; failed, likewise, and the next batch
// first finds where the rows end (its outcome is unknown). Close leaves
// what is still queued unstored and unacknowledged.
//
// # Fencing
//
// An Outbox is opened for one tenure: the session's lease id and the
// owner and fencing version (lease.Token) that the tenure holds. The
// fence table keeps, per lease id, the highest version that opened the
// outbox; Open raises it to the tenure's version (an upsert that refuses
// to lower it), and every statement that claims or changes rows (Open's
// recovery, Append's INSERT, Next's read of a batch, the DELETE of the
// settled rows) carries, in the same statement, a read of the fence row
// FOR SHARE that must find this tenure's owner and version. A successor's
// Open (its upsert of that row) therefore waits for a fenced statement in
// progress, and once it committed every later statement of the deposed
// owner finds another version and changes nothing: it fails with an error
// wrapping ErrFenced, and the Outbox refuses everything after it. So once
// the newer owner took the outbox over (the first thing its tenure does,
// before it connects to the source), a deposed owner can neither add,
// claim nor delete a row, and every row that it stored before is the
// successor's. This is the fencing-token rule enforced by the storage
// (the highest version seen wins); it does not read the lease table,
// which lease/pgstore owns. Between the successor's grant and its Open,
// the deposed owner is stopped by its own guard (Options.Valid: its local
// lease deadline, which the lease protocol passes before a successor can
// be granted); what it might still store or settle there is handed to the
// successor or was delivered, never lost.
//
// Sequence numbers are assigned by the one committer, in queue order,
// and the reader reads only below the first seq not committed, so commit
// order is seq order and the reader never sees a gap that a later commit
// would fill.
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/spool"
	"github.com/myriarch/myriarch/internal/bridge/transport"
)

// Table and FenceTable are the tables this package owns.
const (
	Table      = "myriarch_bridge_outbox"
	FenceTable = "myriarch_bridge_outbox_fence"
)

// ErrFenced is wrapped by every error of an Outbox whose tenure was
// superseded: the lease row no longer has the owner and version it was
// opened with. It ends the tenure; it never means a message was dropped
// (an Append that failed with it left the message unacknowledged at the
// source).
var ErrFenced = errors.New("outbox: fenced")

// ErrFull is returned by Append when the outbox is full and the policy is
// dead_letter (routing.ErrSpoolFull: the route dead-letters the message).
var ErrFull = routing.ErrSpoolFull

// ErrClosed is returned by Append on a closed Outbox, or when the
// caller's quit closed while it waited for room.
var ErrClosed = errors.New("outbox closed")

// Defaults.
const (
	DefaultAckInterval   = 50 * time.Millisecond
	DefaultStatsInterval = time.Second
	DefaultMaxPending    = 1024
	// closeGrace is how long Close lets an INSERT in progress finish
	// before it cancels it (its messages then stay unacknowledged).
	closeGrace = 2 * time.Second
	// readBatch is how many rows one claim reads ahead.
	readBatch = 256
	// ackBatch is how many settled rows trigger a DELETE before the
	// interval.
	ackBatch = 512
	// rowOverhead is what a row costs beyond topic, payload and
	// properties in the size bound (the key, seq, times, flags).
	rowOverhead = 48
)

// Options configure an Outbox.
type Options struct {
	// Pool is the lease store's database.
	// The Outbox does not close it unless it came from OpenPool and
	// OwnPool is set.
	Pool    *pgxpool.Pool
	OwnPool bool
	// Lease is the lease id of the route's session, Owner and Version
	// the token of the tenure that opens the Outbox.
	Lease   string
	Owner   string
	Version int64
	// Valid, if set, is the tenure's own guard (its local lease
	// deadline): when it reports false, Append, Next and the DELETE of
	// settled rows are refused like a fenced statement.
	Valid func() bool
	// Route is the route's id: one outbox per lease and route.
	Route string
	// MaxBytes and MaxMessages bound what the outbox holds (0: no bound).
	MaxBytes    int64
	MaxMessages int64
	Full        string // spool.FullBlock (default) or spool.FullDeadLetter
	// MaxPending bounds the messages handed to Enqueue and not yet
	// reported (queued, or in the INSERT being committed); Enqueue waits
	// beyond it (default DefaultMaxPending). The source's receive maximum
	// usually bounds them first.
	MaxPending int
	// AckInterval is the cadence at which settled rows are deleted, in
	// one statement (default 50ms); a crash re-delivers what was settled
	// since the last one.
	AckInterval time.Duration
	// StatsInterval is the cadence of OnStats (default 1s).
	StatsInterval time.Duration
	// OnStats, if set, receives the figures every StatsInterval.
	OnStats func(spool.Stats)
	// OnFenced, if set, is called once, from whichever goroutine found
	// out, when a statement was refused because a newer owner holds the
	// lease.
	OnFenced func(error)
	Logger   *slog.Logger
	// Now is the clock of the oldest-age figure (nil: time.Now).
	Now func() time.Time
}

// handed is a row the reader handed out and that is not settled yet.
type handed struct {
	size int64
	recv time.Time
}

type row struct {
	seq  uint64
	size int64
	msg  transport.Message
}

// Outbox is one route's spool rows for one tenure. Enqueue (or Append)
// is called by one goroutine at a time: the order of its calls is the
// rows' order; Next by one reader at a time (Attach); Ack from any
// goroutine.
type Outbox struct {
	opts Options
	log  *slog.Logger

	dbMu sync.Mutex // claims and deletes do not interleave (see Next)

	mu        sync.Mutex
	changed   chan struct{}
	closed    bool
	fenced    error
	nextSeq   uint64 // the seq of the next append
	readSeq   uint64 // the first seq the reader has not fetched
	buf       []row  // fetched, not handed out
	handedOut map[uint64]handed
	pending   map[uint64]handed // handed out before a Detach, not settled
	acked     map[uint64]struct{}
	ackq      []uint64 // settled, not deleted yet
	attached  bool
	gen       uint64 // bumped by Detach: a fetch in progress is stale
	count     int64
	bytes     int64
	stats     spool.Stats

	// The group commit: what Enqueue queued and the committer has not
	// taken yet, in order; unreported counts those and the batch being
	// committed (bounded by MaxPending); queuedN and queuedBytes are the
	// rows among them that the full bound counts.
	queue       []*entry
	unreported  int
	queuedN     int64
	queuedBytes int64
	// resync is set by an INSERT whose outcome is unknown (its statement
	// failed, perhaps after its commit): the next batch first reads where
	// the rows end.
	resync bool
	// statements counts the INSERTs issued (tests: one per group).
	statements atomic.Int64

	closeGrace   time.Duration // Close's wait for an INSERT in progress (closeGrace)
	wake         chan struct{} // Enqueue → the committer
	commitCtx    context.Context
	cancelCommit context.CancelFunc // Close, once the grace for a statement in progress is over
	commitDone   chan struct{}
	kick         chan struct{} // an early DELETE (ackBatch settled rows)
	stop         chan struct{}
	done         chan struct{}
}

// OpenPool opens a pool on dsn for an Outbox, with synchronous_commit on
// whatever the server default: an Append acknowledged to the source must
// survive a server crash.
func OpenPool(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	if cfg.MaxConns > 4 {
		// One appender, one reader, one acknowledger and the figures.
		cfg.MaxConns = 4
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return pool, nil
}

// schemaLockKey is the advisory lock that serialises Migrate
// ("myriarch-outbox").
const schemaLockKey int64 = 0x6d796f7574626f78

// Migrate creates the outbox's tables, one process at a time. It is
// idempotent.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", schemaLockKey); err != nil {
			return err
		}
		// Rows are deleted when settled; version is the fencing version
		// of the tenure that appended the row (for the operator's eye).
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+Table+` (
			lease_id    text     NOT NULL,
			route       text     NOT NULL,
			seq         bigint   NOT NULL,
			version     bigint   NOT NULL,
			received_ns bigint   NOT NULL,
			qos         smallint NOT NULL,
			retain      boolean  NOT NULL,
			topic       text     NOT NULL,
			payload     bytea    NOT NULL,
			properties  bytea,
			size        bigint   NOT NULL,
			PRIMARY KEY (lease_id, route, seq)
		)`)
		if err != nil {
			return err
		}
		// The highest lease version that opened the outbox of a lease
		// id, and its owner: the fencing token the rows obey.
		_, err = tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+FenceTable+` (
			lease_id   text   NOT NULL PRIMARY KEY,
			version    bigint NOT NULL,
			owner      text   NOT NULL,
			fenced_at  timestamptz NOT NULL DEFAULT now()
		)`)
		return err
	})
	if err != nil {
		return fmt.Errorf("outbox: schema: %w", err)
	}
	return nil
}

// fenceCTE locks the fence row of the tenure for the statement's
// transaction ($1 lease id, $2 owner, $3 version): a successor's Open
// (its upsert of the row) waits for it, and a statement after that finds
// no row.
const fenceCTE = `f AS (SELECT 1 FROM ` + FenceTable + ` WHERE lease_id = $1 AND owner = $2 AND version = $3 FOR SHARE)`

// takeSQL raises the fence to the tenure's version; the same version is
// taken again only by its own owner (another route, or a reopen, of the
// same tenure), and a lower one never.
const takeSQL = `INSERT INTO ` + FenceTable + ` AS x (lease_id, version, owner) VALUES ($1, $3, $2)
	ON CONFLICT (lease_id) DO UPDATE SET version = EXCLUDED.version, owner = EXCLUDED.owner, fenced_at = now()
	WHERE x.version < EXCLUDED.version OR (x.version = EXCLUDED.version AND x.owner = EXCLUDED.owner)`

// Open migrates the schema and opens the outbox of (Lease, Route) for the
// tenure (Owner, Version): it recovers, fenced, what the rows hold.
func Open(ctx context.Context, opts Options) (*Outbox, error) {
	if opts.Pool == nil || opts.Lease == "" || opts.Route == "" || opts.Owner == "" || opts.Version <= 0 {
		return nil, errors.New("outbox: Pool, Lease, Route, Owner and a positive Version are required")
	}
	if opts.Full == "" {
		opts.Full = spool.FullBlock
	}
	if opts.Full != spool.FullBlock && opts.Full != spool.FullDeadLetter {
		return nil, fmt.Errorf("outbox: full policy %q: must be %s or %s", opts.Full, spool.FullBlock, spool.FullDeadLetter)
	}
	if opts.AckInterval <= 0 {
		opts.AckInterval = DefaultAckInterval
	}
	if opts.StatsInterval <= 0 {
		opts.StatsInterval = DefaultStatsInterval
	}
	if opts.MaxPending <= 0 {
		opts.MaxPending = DefaultMaxPending
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if err := Migrate(ctx, opts.Pool); err != nil {
		return nil, err
	}
	o := &Outbox{opts: opts, log: opts.Logger.With("outbox", Table, "lease", opts.Lease, "route", opts.Route, "version", opts.Version),
		changed: make(chan struct{}), handedOut: map[uint64]handed{}, pending: map[uint64]handed{}, acked: map[uint64]struct{}{},
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		wake: make(chan struct{}, 1), commitDone: make(chan struct{}), closeGrace: closeGrace}
	o.commitCtx, o.cancelCommit = context.WithCancel(context.Background())
	var fenceOK bool
	var n, bytes, first, last int64
	err := pgx.BeginFunc(ctx, opts.Pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, takeSQL, opts.Lease, opts.Owner, opts.Version)
		if err != nil || tag.RowsAffected() != 1 {
			return err // a newer version holds the fence: fenceOK stays false
		}
		fenceOK = true
		return tx.QueryRow(ctx, `SELECT count(*), coalesce(sum(size), 0), coalesce(min(seq), 1), coalesce(max(seq), 0)
			FROM `+Table+` WHERE lease_id = $1 AND route = $2`, opts.Lease, opts.Route).Scan(&n, &bytes, &first, &last)
	})
	if err != nil {
		o.cancelCommit()
		return nil, fmt.Errorf("outbox %s/%s: open: %w", opts.Lease, opts.Route, err)
	}
	if !fenceOK {
		o.cancelCommit()
		return nil, o.fencedErr(ctx, "open")
	}
	o.count, o.bytes = n, bytes
	o.readSeq, o.nextSeq = uint64(first), uint64(last)+1
	o.stats.Recovered = n
	o.stats.PeakMessages = n
	go o.loop()
	go o.commitLoop()
	return o, nil
}

// fencedErr builds the error of a refused statement, naming the lease's
// current holder, and makes the Outbox refuse everything after it.
func (o *Outbox) fencedErr(ctx context.Context, op string) error {
	cur := "unknown"
	var owner string
	var version int64
	if err := o.opts.Pool.QueryRow(ctx, "SELECT owner, version FROM "+FenceTable+" WHERE lease_id = $1", o.opts.Lease).Scan(&owner, &version); err == nil {
		cur = fmt.Sprintf("%s@v%d", owner, version)
	}
	err := fmt.Errorf("%w: %s of route %q refused: this tenure is %s@v%d and the outbox of lease %q was taken over by %s", ErrFenced, op, o.opts.Route, o.opts.Owner, o.opts.Version, o.opts.Lease, cur)
	return o.setFenced(err)
}

// ErrTenureEnded is wrapped (with ErrFenced) by what an Outbox refuses
// once its tenure's own guard (Options.Valid) reported the local lease
// deadline passed.
var ErrTenureEnded = errors.New("the tenure's lease deadline passed")

// guard refuses when the tenure's own guard reports it ended.
func (o *Outbox) guard(op string) error {
	if o.opts.Valid == nil || o.opts.Valid() {
		return nil
	}
	return o.setFenced(fmt.Errorf("%w: %w: %s of route %q refused: this tenure is %s@v%d", ErrFenced, ErrTenureEnded, op, o.opts.Route, o.opts.Owner, o.opts.Version))
}

// setFenced makes the Outbox refuse everything after err, reports it
// once and returns it.
func (o *Outbox) setFenced(err error) error {
	o.mu.Lock()
	first := o.fenced == nil
	if first {
		o.fenced = err
		o.notify()
	}
	err = o.fenced
	o.mu.Unlock()
	if first {
		o.log.Error("outbox fenced: this tenure appends, claims and settles nothing more; the rows it did not settle are the successor's", "err", err)
		if o.opts.OnFenced != nil {
			o.opts.OnFenced(err)
		}
	}
	return err
}

// notify wakes the waiters; with o.mu held.
func (o *Outbox) notify() {
	close(o.changed)
	o.changed = make(chan struct{})
}

func rowSize(m *transport.Message, props []byte) int64 {
	return int64(len(m.Topic)+len(m.Payload)+len(props)) + rowOverhead
}

// entry is a message handed to the outbox and not yet reported.
type entry struct {
	msg    transport.Message
	props  []byte
	size   int64
	full   bool // refused by the full policy (dead_letter): not stored
	stored func(error)
}

// Enqueue queues m for the next group commit and returns (the route's
// hand-over, routing.GroupSpool): stored is called, in the order of the
// Enqueue calls, from the outbox's committer once the INSERT that holds m
// committed (nil), failed or was fenced (m stays unacknowledged), or
// with ErrFull (dead_letter: m was refused because the outbox was full
// when it was queued). Enqueue waits while MaxPending messages are not
// yet reported, or (block) while the outbox is full counting what is
// queued, until quit closes (ErrClosed). It refuses at once on a closed
// or fenced Outbox; then stored is never called.
func (o *Outbox) Enqueue(m *transport.Message, quit <-chan struct{}, stored func(error)) error {
	var props []byte
	if m.Properties != nil {
		b, err := json.Marshal(m.Properties)
		if err != nil {
			return fmt.Errorf("outbox: properties: %w", err)
		}
		props = b
	}
	e := &entry{msg: *m, props: props, size: rowSize(m, props), stored: stored}
	if e.msg.Payload == nil {
		e.msg.Payload = []byte{} // the column is NOT NULL; pgx sends nil as NULL
	}
	o.mu.Lock()
	for {
		if o.closed {
			o.mu.Unlock()
			return ErrClosed
		}
		if o.fenced != nil {
			err := o.fenced
			o.mu.Unlock()
			return err
		}
		if o.unreported < o.opts.MaxPending {
			n, b := o.count+o.queuedN, o.bytes+o.queuedBytes
			full := (o.opts.MaxMessages > 0 && n+1 > o.opts.MaxMessages) || (o.opts.MaxBytes > 0 && n > 0 && b+e.size > o.opts.MaxBytes)
			if !full {
				break
			}
			if o.opts.Full == spool.FullDeadLetter {
				e.full = true
				break
			}
		}
		ch := o.changed
		o.mu.Unlock()
		select {
		case <-ch:
		case <-quit:
			return ErrClosed
		}
		o.mu.Lock()
	}
	o.queue = append(o.queue, e)
	o.unreported++
	if !e.full {
		o.queuedN++
		o.queuedBytes += e.size
	}
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
	return nil
}

// Append stores m and returns once its INSERT committed (Enqueue and a
// wait for its verdict), or ErrFull (dead_letter), or the error that left
// it unstored. When quit closes first it returns ErrClosed; a message
// already queued may then still be stored (it was not acknowledged: at
// most a duplicate, never a loss).
func (o *Outbox) Append(m *transport.Message, quit <-chan struct{}) error {
	res := make(chan error, 1)
	if err := o.Enqueue(m, quit, func(err error) { res <- err }); err != nil {
		return err
	}
	select {
	case err := <-res:
		return err
	case <-quit:
		return ErrClosed
	}
}

// commitLoop is the one committer: it stores what queued up while the
// previous INSERT ran, all of it in one fenced statement, then reports
// each message's verdict in order. It runs until Close, which leaves
// what is still queued unstored and unacknowledged (ErrClosed).
func (o *Outbox) commitLoop() {
	defer close(o.commitDone)
	for {
		select {
		case <-o.stop:
			o.failQueue(ErrClosed)
			return
		case <-o.wake:
		}
		for {
			select {
			case <-o.stop:
				o.failQueue(ErrClosed)
				return
			default:
			}
			o.mu.Lock()
			batch := o.queue
			o.queue = nil
			o.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			o.commit(batch)
		}
	}
}

// failQueue reports err for everything still queued.
func (o *Outbox) failQueue(err error) {
	o.mu.Lock()
	batch := o.queue
	o.queue = nil
	o.mu.Unlock()
	o.verdict(batch, 0, 0, err)
}

// verdict gives the verdict of a batch: nil (stored) for what it stored,
// ErrFull for what the full policy refused, err for all of it when err
// is set. n and bytes are what the batch stored.
func (o *Outbox) verdict(batch []*entry, n, bytes int64, err error) {
	if len(batch) == 0 {
		return
	}
	var qn, qb int64
	for _, e := range batch {
		if !e.full {
			qn++
			qb += e.size
		}
	}
	o.mu.Lock()
	o.queuedN -= qn
	o.queuedBytes -= qb
	if err == nil {
		o.nextSeq += uint64(n)
		o.count += n
		o.bytes += bytes
		o.stats.PeakMessages = max(o.stats.PeakMessages, o.count)
	}
	o.notify()
	o.mu.Unlock()
	for _, e := range batch {
		switch {
		case err != nil:
			e.stored(err)
		case e.full:
			e.stored(ErrFull)
		default:
			e.stored(nil)
		}
	}
	// Only now is there room for more: MaxPending bounds the messages
	// whose verdict has not been reported.
	o.mu.Lock()
	o.unreported -= len(batch)
	o.notify()
	o.mu.Unlock()
}

// insertSQL stores a batch in one statement, fenced like every other
// ($1 lease id, $2 owner, $3 version, $4 route, then one array per
// column): when the fence row is not this tenure's, it inserts nothing.
const insertSQL = `WITH ` + fenceCTE + `
	INSERT INTO ` + Table + ` (lease_id, route, seq, version, received_ns, qos, retain, topic, payload, properties, size)
	SELECT $1, $4, u.seq, $3, u.recv, u.qos, u.retain, u.topic, u.payload, u.props, u.size
	FROM f, unnest($5::bigint[], $6::bigint[], $7::smallint[], $8::boolean[], $9::text[], $10::bytea[], $11::bytea[], $12::bigint[])
		AS u(seq, recv, qos, retain, topic, payload, props, size)`

// commit stores batch (what queued up) in one fenced INSERT and reports
// it. Rows take consecutive seqs from nextSeq in queue order; only this
// goroutine moves nextSeq, so commit order is seq order.
func (o *Outbox) commit(batch []*entry) {
	o.mu.Lock()
	fenced, resync := o.fenced, o.resync
	o.mu.Unlock()
	if fenced != nil {
		o.verdict(batch, 0, 0, fenced)
		return
	}
	if err := o.guard("append"); err != nil {
		o.verdict(batch, 0, 0, err)
		return
	}
	ctx := o.commitCtx
	if resync {
		if err := o.resyncSeq(ctx); err != nil {
			o.verdict(batch, 0, 0, err)
			return
		}
	}
	o.mu.Lock()
	seq := o.nextSeq
	o.mu.Unlock()
	var (
		seqs, recvs, sizes []int64
		qoss               []int16
		retains            []bool
		topics             []string
		payloads, props    [][]byte
		bytes              int64
	)
	for _, e := range batch {
		if e.full {
			continue
		}
		var recv int64
		if !e.msg.Received.IsZero() {
			recv = e.msg.Received.UnixNano()
		}
		seqs = append(seqs, int64(seq)+int64(len(seqs)))
		recvs = append(recvs, recv)
		qoss = append(qoss, int16(e.msg.QoS))
		retains = append(retains, e.msg.Retain)
		topics = append(topics, e.msg.Topic)
		payloads = append(payloads, e.msg.Payload)
		props = append(props, e.props)
		sizes = append(sizes, e.size)
		bytes += e.size
	}
	n := int64(len(seqs))
	if n == 0 {
		o.verdict(batch, 0, 0, nil) // every one refused by the full policy
		return
	}
	o.statements.Add(1)
	tag, err := o.opts.Pool.Exec(ctx, insertSQL, o.opts.Lease, o.opts.Owner, o.opts.Version, o.opts.Route,
		seqs, recvs, qoss, retains, topics, payloads, props, sizes)
	if err != nil {
		// Perhaps committed after all (the reply lost): the next batch
		// first finds where the rows end.
		o.mu.Lock()
		o.resync = true
		o.mu.Unlock()
		o.verdict(batch, 0, 0, fmt.Errorf("outbox %s/%s: append: %w", o.opts.Lease, o.opts.Route, err))
		return
	}
	if tag.RowsAffected() != n {
		o.verdict(batch, 0, 0, o.fencedErr(context.WithoutCancel(ctx), "append"))
		return
	}
	o.verdict(batch, n, bytes, nil)
}

// resyncSeq finds where the rows end after an INSERT whose outcome is
// unknown: if its rows were committed after all, the sequence moves past
// them and they count as held (the source, which was not acknowledged,
// sends them again: duplicates, never a gap or a reused seq).
func (o *Outbox) resyncSeq(ctx context.Context) error {
	o.mu.Lock()
	from := o.nextSeq
	o.mu.Unlock()
	var last, n, bytes int64
	if err := o.opts.Pool.QueryRow(ctx, `SELECT coalesce(max(seq), 0), count(*), coalesce(sum(size), 0) FROM `+Table+`
		WHERE lease_id = $1 AND route = $2 AND seq >= $3`, o.opts.Lease, o.opts.Route, int64(from)).Scan(&last, &n, &bytes); err != nil {
		return fmt.Errorf("outbox %s/%s: append: %w", o.opts.Lease, o.opts.Route, err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if n > 0 {
		o.nextSeq = uint64(last) + 1
		o.count += n
		o.bytes += bytes
		o.stats.PeakMessages = max(o.stats.PeakMessages, o.count)
		o.notify()
	}
	o.resync = false
	return nil
}

// quitContext is a context that ends when quit closes.
func quitContext(quit <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	if quit == nil {
		return ctx, cancel
	}
	stop := make(chan struct{})
	go func() {
		select {
		case <-quit:
			cancel()
		case <-stop:
		}
	}()
	return ctx, func() { close(stop); cancel() }
}

// Attach makes the caller the one reader, waiting until the previous one
// detached or quit closes (false).
func (o *Outbox) Attach(quit <-chan struct{}) bool {
	for {
		o.mu.Lock()
		if o.closed || o.fenced != nil {
			o.mu.Unlock()
			return false
		}
		if !o.attached {
			o.attached = true
			o.mu.Unlock()
			return true
		}
		ch := o.changed
		o.mu.Unlock()
		select {
		case <-ch:
		case <-quit:
			return false
		}
	}
}

// Detach ends the reader and rewinds: what it was handed and did not
// settle is handed out again to the next reader, in order; what it
// settled and is not deleted yet is skipped.
func (o *Outbox) Detach() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.attached = false
	back := o.readSeq
	for seq, h := range o.handedOut {
		o.pending[seq] = h
		back = min(back, seq)
	}
	for _, r := range o.buf {
		back = min(back, r.seq)
	}
	clear(o.handedOut)
	o.buf = nil
	o.readSeq = back
	o.gen++
	o.notify()
}

// Next hands out the next row in seq order, waiting for one until quit
// closes (false). Rows are claimed in batches by a fenced read; a
// database error other than fencing is retried (the pump waits for the
// database rather than giving up its route); fencing is returned.
func (o *Outbox) Next(quit <-chan struct{}) (uint64, *transport.Message, bool, error) {
	retry := 100 * time.Millisecond
	for {
		o.mu.Lock()
		if o.closed {
			o.mu.Unlock()
			return 0, nil, false, nil
		}
		if o.fenced != nil {
			err := o.fenced
			o.mu.Unlock()
			return 0, nil, false, err
		}
		if len(o.buf) > 0 {
			r := o.buf[0]
			o.buf = o.buf[1:]
			if _, settled := o.acked[r.seq]; settled {
				o.mu.Unlock()
				continue
			}
			delete(o.pending, r.seq)
			o.handedOut[r.seq] = handed{size: r.size, recv: r.msg.Received}
			o.mu.Unlock()
			m := r.msg
			return r.seq, &m, true, nil
		}
		if o.readSeq < o.nextSeq {
			from, upto, gen := o.readSeq, o.nextSeq, o.gen
			o.mu.Unlock()
			rows, err := o.claim(quit, from)
			o.mu.Lock()
			if err != nil {
				o.mu.Unlock()
				if errors.Is(err, ErrFenced) {
					return 0, nil, false, err
				}
				select {
				case <-quit:
					return 0, nil, false, nil
				default:
				}
				o.log.Warn("outbox read failed; retrying", "err", err, "retry_in", retry)
				select {
				case <-quit:
					return 0, nil, false, nil
				case <-time.After(retry):
				}
				retry = min(2*retry, 5*time.Second)
				continue
			}
			retry = 100 * time.Millisecond
			if gen == o.gen {
				o.buf = rows
				if len(rows) > 0 {
					o.readSeq = rows[len(rows)-1].seq + 1
				} else {
					// Every row below upto was deleted (settled).
					o.readSeq = upto
				}
			}
			o.mu.Unlock()
			continue
		}
		ch := o.changed
		o.mu.Unlock()
		select {
		case <-ch:
		case <-quit:
			return 0, nil, false, nil
		}
	}
}

// claim reads, fenced, up to readBatch rows from seq from.
func (o *Outbox) claim(quit <-chan struct{}, from uint64) ([]row, error) {
	if err := o.guard("claim"); err != nil {
		return nil, err
	}
	ctx, cancel := quitContext(quit)
	defer cancel()
	o.dbMu.Lock()
	defer o.dbMu.Unlock()
	var out []row
	fenceOK := false
	err := pgx.BeginFunc(ctx, o.opts.Pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `WITH `+fenceCTE+` SELECT EXISTS (SELECT 1 FROM f)`, o.opts.Lease, o.opts.Owner, o.opts.Version).Scan(&fenceOK); err != nil {
			return err
		}
		if !fenceOK {
			return nil
		}
		rows, err := tx.Query(ctx, `SELECT seq, received_ns, qos, retain, topic, payload, properties, size FROM `+Table+`
			WHERE lease_id = $1 AND route = $2 AND seq >= $3 ORDER BY seq LIMIT $4`, o.opts.Lease, o.opts.Route, int64(from), readBatch)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r row
			var seq, recv int64
			var qos int16
			var props []byte
			if err := rows.Scan(&seq, &recv, &qos, &r.msg.Retain, &r.msg.Topic, &r.msg.Payload, &props, &r.size); err != nil {
				return err
			}
			r.seq, r.msg.QoS = uint64(seq), byte(qos)
			if recv != 0 {
				r.msg.Received = time.Unix(0, recv)
			}
			if props != nil {
				var p sender.Properties
				if err := json.Unmarshal(props, &p); err != nil {
					return fmt.Errorf("row %d: properties: %w", seq, err)
				}
				r.msg.Properties = &p
			}
			out = append(out, r)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("outbox %s/%s: claim: %w", o.opts.Lease, o.opts.Route, err)
	}
	if !fenceOK {
		return nil, o.fencedErr(context.WithoutCancel(ctx), "claim")
	}
	return out, nil
}

// Ack settles row seq: it is deleted with the next batch (every
// AckInterval, or at ackBatch rows). Acking twice, or a row not handed
// out, is harmless. A batch refused by fencing is left to the successor,
// which delivers those rows again (the declared duplicate window).
func (o *Outbox) Ack(seq uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	h, ok := o.handedOut[seq]
	if ok {
		delete(o.handedOut, seq)
	} else if h, ok = o.pending[seq]; ok {
		delete(o.pending, seq)
	} else {
		return
	}
	o.acked[seq] = struct{}{}
	o.ackq = append(o.ackq, seq)
	o.count--
	o.bytes -= h.size
	if len(o.ackq) == ackBatch {
		select {
		case o.kick <- struct{}{}:
		default:
		}
	}
	o.notify()
}

// flush deletes the settled rows, fenced, in one statement.
func (o *Outbox) flush(ctx context.Context) error {
	o.dbMu.Lock()
	defer o.dbMu.Unlock()
	o.mu.Lock()
	if len(o.ackq) == 0 || o.fenced != nil {
		o.mu.Unlock()
		return nil
	}
	seqs := make([]int64, len(o.ackq))
	for i, s := range o.ackq {
		seqs[i] = int64(s)
	}
	o.mu.Unlock()
	if err := o.guard("acknowledge"); err != nil {
		return err
	}
	var fenceOK bool
	err := o.opts.Pool.QueryRow(ctx, `WITH `+fenceCTE+`,
		d AS (DELETE FROM `+Table+` WHERE lease_id = $1 AND route = $4 AND seq = ANY($5) AND EXISTS (SELECT 1 FROM f) RETURNING 1)
		SELECT EXISTS (SELECT 1 FROM f), (SELECT count(*) FROM d)`,
		o.opts.Lease, o.opts.Owner, o.opts.Version, o.opts.Route, seqs).Scan(&fenceOK, new(int64))
	if err != nil {
		return fmt.Errorf("outbox %s/%s: acknowledge: %w", o.opts.Lease, o.opts.Route, err)
	}
	if !fenceOK {
		return o.fencedErr(ctx, "acknowledge")
	}
	o.mu.Lock()
	o.ackq = o.ackq[len(seqs):]
	for _, s := range seqs {
		delete(o.acked, uint64(s))
	}
	o.mu.Unlock()
	return nil
}

// loop deletes settled rows every AckInterval and reports the figures
// every StatsInterval.
func (o *Outbox) loop() {
	defer close(o.done)
	ack := time.NewTicker(o.opts.AckInterval)
	defer ack.Stop()
	st := time.NewTicker(o.opts.StatsInterval)
	defer st.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-o.stop
		cancel()
	}()
	for {
		select {
		case <-o.stop:
			return
		case <-ack.C:
		case <-o.kick:
		case <-st.C:
			o.report(ctx)
			continue
		}
		if err := o.flush(ctx); err != nil && !errors.Is(err, ErrFenced) && ctx.Err() == nil {
			o.log.Warn("outbox acknowledge failed; retrying", "err", err)
		}
	}
}

// report refreshes the oldest age (a read of the first row not settled)
// and calls OnStats.
func (o *Outbox) report(ctx context.Context) {
	o.mu.Lock()
	oldest := time.Time{}
	for _, h := range o.handedOut {
		if oldest.IsZero() || (!h.recv.IsZero() && h.recv.Before(oldest)) {
			oldest = h.recv
		}
	}
	for _, h := range o.pending {
		if oldest.IsZero() || (!h.recv.IsZero() && h.recv.Before(oldest)) {
			oldest = h.recv
		}
	}
	count, from := o.count, o.readSeq
	skip := make([]int64, 0, len(o.acked))
	for s := range o.acked {
		skip = append(skip, int64(s))
	}
	o.mu.Unlock()
	if count > 0 && oldest.IsZero() {
		// Nothing handed out (an outage): the oldest is the first row
		// the reader has not reached.
		var ns int64
		err := o.opts.Pool.QueryRow(ctx, `SELECT received_ns FROM `+Table+` WHERE lease_id = $1 AND route = $2 AND seq >= $3
			AND NOT (seq = ANY($4)) ORDER BY seq LIMIT 1`, o.opts.Lease, o.opts.Route, int64(from), skip).Scan(&ns)
		if err == nil && ns != 0 {
			oldest = time.Unix(0, ns)
		}
	}
	o.mu.Lock()
	if count > 0 && !oldest.IsZero() {
		o.stats.OldestAgeS = max(0, o.opts.Now().Sub(oldest).Seconds())
	} else if count == 0 {
		o.stats.OldestAgeS = 0
	}
	s := o.statsLocked()
	o.mu.Unlock()
	if o.opts.OnStats != nil {
		o.opts.OnStats(s)
	}
}

// Stats reports what the outbox holds (the oldest age as of the last
// report).
func (o *Outbox) Stats() spool.Stats {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.statsLocked()
}

func (o *Outbox) statsLocked() spool.Stats {
	s := o.stats
	s.Messages, s.Bytes = o.count, o.bytes
	if o.count == 0 {
		s.OldestAgeS = 0
	}
	return s
}

// Fenced returns the fencing error, or nil while the tenure's lease
// version is current as far as this Outbox found.
func (o *Outbox) Fenced() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.fenced
}

// Close deletes what was settled (bounded, best effort: what it could not
// delete is delivered again by the next owner), stops the Outbox and
// closes the pool if it owns it. The rows stay for the next tenure.
func (o *Outbox) Close() error {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return nil
	}
	o.closed = true
	o.notify()
	o.mu.Unlock()
	close(o.stop)
	<-o.done
	// The committer ends after the INSERT in progress (its messages are
	// acknowledged if it commits), leaving what is still queued
	// unacknowledged; a statement that outlasts the grace is cancelled.
	select {
	case <-o.commitDone:
	case <-time.After(o.closeGrace):
		o.cancelCommit()
		<-o.commitDone
	}
	o.cancelCommit()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := o.flush(ctx)
	if errors.Is(err, ErrFenced) {
		err = nil // reported when found; the successor has the rows
	}
	if o.opts.OwnPool {
		o.opts.Pool.Close()
	}
	return err
}
