// Package lastseen batches agents' last-seen times and events in memory
// and writes them to the database periodically, so that a heartbeat costs
// no database write of its own.
package lastseen

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/prometheus/client_golang/prometheus"
)

// Writer is what the batcher writes to (the store).
type Writer interface {
	FlushSeen(ctx context.Context, batch []store.Seen) (int64, error)
	InsertEvents(ctx context.Context, evs []store.Event) error
}

type key struct{ uid, conn string }

type seenAt struct {
	at      time.Time
	replica string
}

// Batcher collects last-seen times and events between flushes.
type Batcher struct {
	w        Writer
	interval time.Duration
	log      *slog.Logger

	mu     sync.Mutex
	seen   map[key]seenAt
	events []store.Event

	flushMu sync.Mutex // one flush at a time

	flushes  prometheus.Counter
	rows     prometheus.Counter
	failures prometheus.Counter
}

// New returns a batcher that flushes every interval once Run is called.
// reg may be nil.
func New(w Writer, interval time.Duration, log *slog.Logger, reg prometheus.Registerer) *Batcher {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Batcher{w: w, interval: interval, log: log, seen: map[key]seenAt{},
		flushes:  prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_lastseen_flushes_total", Help: "Batched flushes of last-seen times and events."}),
		rows:     prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_lastseen_rows_total", Help: "Last-seen times and events written."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_lastseen_flush_failures_total", Help: "Failed flushes (the batch is kept for the next one)."}),
	}
	if reg != nil {
		reg.MustRegister(b.flushes, b.rows, b.failures)
	}
	return b
}

// Touch records that agent uid was seen on connection conn at time at.
func (b *Batcher) Touch(uid, conn string, at time.Time) { b.TouchOn(uid, conn, "", at) }

// TouchOn is Touch that also records replica as the agent's replica with
// the time (store.Seen.Replica): for plain-HTTP agents, whose polls may
// reach any replica behind a load balancer.
func (b *Batcher) TouchOn(uid, conn, replica string, at time.Time) {
	b.mu.Lock()
	k := key{uid, conn}
	if at.After(b.seen[k].at) {
		b.seen[k] = seenAt{at, replica}
	}
	b.mu.Unlock()
}

// Event queues an event.
func (b *Batcher) Event(ev store.Event) {
	b.mu.Lock()
	b.events = append(b.events, ev)
	b.mu.Unlock()
}

// Pending reports how many last-seen times and events wait for a flush.
func (b *Batcher) Pending() (seen, events int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.seen), len(b.events)
}

// Run flushes every interval until ctx ends. It does not flush at the end:
// the owner calls Flush with its own deadline (the final flush of a
// planned stop).
func (b *Batcher) Run(ctx context.Context) {
	t := time.NewTicker(b.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := b.Flush(ctx); err != nil && ctx.Err() == nil {
				b.log.Warn("flushing last-seen times and events failed; retrying at the next flush", "error", err)
			}
		}
	}
}

// Flush writes everything pending. What fails to be written is put back
// for the next flush (newer times win).
func (b *Batcher) Flush(ctx context.Context) error {
	b.flushMu.Lock()
	defer b.flushMu.Unlock()
	b.mu.Lock()
	seen, events := b.seen, b.events
	b.seen, b.events = make(map[key]seenAt, len(seen)), nil
	b.mu.Unlock()
	if len(seen) == 0 && len(events) == 0 {
		return nil
	}
	batch := make([]store.Seen, 0, len(seen))
	for k, v := range seen {
		batch = append(batch, store.Seen{UID: k.uid, ConnID: k.conn, At: v.at, Replica: v.replica})
	}
	_, errSeen := b.w.FlushSeen(ctx, batch)
	errEv := b.w.InsertEvents(ctx, events)
	b.mu.Lock()
	if errSeen != nil {
		for k, v := range seen {
			if v.at.After(b.seen[k].at) {
				b.seen[k] = v
			}
		}
	}
	if errEv != nil {
		b.events = append(events, b.events...)
	}
	b.mu.Unlock()
	b.flushes.Inc()
	if errSeen == nil {
		b.rows.Add(float64(len(batch)))
	}
	if errEv == nil {
		b.rows.Add(float64(len(events)))
	}
	err := errors.Join(errSeen, errEv)
	if err != nil {
		b.failures.Inc()
	}
	return err
}
