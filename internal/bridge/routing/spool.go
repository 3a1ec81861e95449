package routing

import (
	"context"
	"errors"
	"fmt"

	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/transport"
)

// Spool is a route's durable spool (package spool is the file one).
//
// With a spool, the dispatcher hands a message to the spool (Append) and
// acknowledges the source as soon as the spool holds it durably; the
// route's pump takes the spool's records in order (Next) and delivers
// them like received messages, and a record is settled in the spool (Ack)
// when every sender accepted it or it was dead-lettered. One pump reads a
// spool at a time (Attach, Detach): a reload's new route starts reading
// when the old one closed, from the first record the old one did not
// settle.
type Spool interface {
	// Append stores m durably. When the spool is full it waits for room
	// until quit closes, or returns an error wrapping ErrSpoolFull (the
	// spool's full policy).
	Append(m *transport.Message, quit <-chan struct{}) error
	Attach(quit <-chan struct{}) bool
	// Next returns the next record (false when quit closed or the spool
	// closed).
	Next(quit <-chan struct{}) (seq uint64, m *transport.Message, ok bool, err error)
	Ack(seq uint64)
	Detach()
}

// GroupSpool is a Spool that stores in groups: one commit (the outbox)
// or one fsync (the file spool with fsync always) for every message that
// queued up while the previous one ran. The route
// hands a message over with Enqueue, which does not wait for the store,
// so that the session's packet loop goes on reading while a group is
// made durable; the store's latency then bounds how long a message waits
// for its acknowledgment, not how many messages a second the route takes
// in.
type GroupSpool interface {
	Spool
	// Enqueue queues m and returns. stored is then called exactly once,
	// in the order of the Enqueue calls, from the spool's goroutine (or
	// before Enqueue returns, when the spool holds m as durably as it
	// will at once): with nil once m is durable, with an error wrapping ErrSpoolFull when
	// the spool was full at Enqueue and its policy is to dead-letter, with
	// another error when m was not stored (it must stay unacknowledged).
	// Enqueue waits while the spool's queue of messages not yet reported
	// is at its bound, or (policy block) while the spool is full, until
	// quit closes; when it returns an error it did not take m and never
	// calls stored. Enqueue is called from one goroutine.
	Enqueue(m *transport.Message, quit <-chan struct{}, stored func(error)) error
}

// ErrSpoolFull is what a Spool's Append wraps when it is full and its
// policy is to dead-letter.
var ErrSpoolFull = errors.New("spool full")

// pump moves a spool's records into its route.
type pump struct {
	pause chan struct{} // closed by WaitIdle or Close: take no more
	done  chan struct{}
}

func (r *Route) startPump() {
	p := &pump{pause: make(chan struct{}), done: make(chan struct{})}
	r.pump = p
	go func() {
		defer close(p.done)
		sp := r.cfg.Spool
		if !sp.Attach(p.pause) {
			return
		}
		defer sp.Detach()
		for {
			seq, m, ok, err := sp.Next(p.pause)
			if err != nil {
				r.log.Error("spool read failed; the route takes nothing more from its spool until it is rebuilt", "err", err)
				return
			}
			if !ok {
				return
			}
			if err := r.Deliver(m, func() { sp.Ack(seq) }); err != nil {
				// Closed, or the tenure ended: the record stays in the
				// spool, unsettled, for the next route.
				return
			}
		}
	}()
}

// pausePump stops the pump taking records and waits for it until ctx ends.
func (r *Route) pausePump(ctx context.Context) error {
	p := r.pump
	if p == nil {
		return nil
	}
	r.mu.Lock()
	select {
	case <-p.pause:
	default:
		close(p.pause)
	}
	r.mu.Unlock()
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stopPump tells the pump to stop; with r.mu held.
func (r *Route) stopPump() {
	if p := r.pump; p != nil {
		select {
		case <-p.pause:
		default:
			close(p.pause)
		}
	}
}

// waitPump waits for the pump to end (Close: the route's quit unblocked
// its Deliver).
func (r *Route) waitPump() {
	if p := r.pump; p != nil {
		<-p.done
	}
}

// take is the dispatcher's hand-over: straight to Deliver, or through the
// spool. A GroupSpool takes the message without waiting for its store,
// and the source is acknowledged (settled) from the spool's goroutine once
// the message is durable, in arrival order; a plain Spool's Append is
// awaited here. A full spool whose policy is dead_letter writes the
// message to the dead-letter file for each sender of the route (reason
// "spool full") and settles it; if that write fails the message stays
// unacknowledged.
func (r *Route) take(m *transport.Message, settled func()) error {
	sp := r.cfg.Spool
	if sp == nil {
		return r.Deliver(m, settled)
	}
	if (m.Retain && r.cfg.Retain == RetainDrop) || r.fromPeer(m) {
		return r.Deliver(m, settled) // not delivered: settled at once
	}
	if gs, ok := sp.(GroupSpool); ok {
		err := gs.Enqueue(m, r.quit, func(err error) { _ = r.stored(m, settled, err) })
		if err != nil {
			r.log.Error("spool append failed; the message stays unacknowledged", "topic", m.Topic, "err", err)
		}
		return err
	}
	return r.stored(m, settled, sp.Append(m, r.quit))
}

// stored acts on the spool's verdict on m: settled once durable, the
// dead-letter file when the spool was full (policy dead_letter), nothing
// (unacknowledged) when it could not be stored.
func (r *Route) stored(m *transport.Message, settled func(), err error) error {
	switch {
	case err == nil:
		settled()
		return nil
	case errors.Is(err, ErrSpoolFull):
		sm := sender.Message{Topic: r.rewriteCached(m.Topic), SourceTopic: m.Topic, Payload: m.Payload, QoS: m.QoS, Retain: m.Retain,
			Received: m.Received, Properties: m.Properties, Route: r.cfg.ID, Fence: r.cfg.Fence}
		for _, t := range r.targets {
			if dlErr := r.cfg.DeadLetter.Write(r.cfg.ID, t.cfg.ID, &sm, "spool full: "+err.Error(), 0); dlErr != nil {
				r.log.Error("spool full and the dead-letter write failed; the message stays unacknowledged", "topic", m.Topic, "err", dlErr)
				return fmt.Errorf("spool full, dead-letter: %w", dlErr)
			}
			r.cfg.Metrics.DeadLettered.WithLabelValues(r.cfg.ID, t.cfg.ID).Inc()
		}
		r.log.Warn("spool full: message dead-lettered", "topic", m.Topic)
		settled()
		return nil
	default:
		r.log.Error("spool append failed; the message stays unacknowledged", "topic", m.Topic, "err", err)
		return err
	}
}
