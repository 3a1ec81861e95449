// Package sender defines what the bridge delivers and the contract of the
// destinations it delivers to. The destinations live in the packages
// below this one, one per kind.
package sender

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/fence"
)

// Message is one MQTT message on its way through a route.
type Message struct {
	// Topic is the topic the message is delivered under (after rewrite).
	Topic string
	// SourceTopic is the topic it arrived on.
	SourceTopic string
	Payload     []byte
	QoS         byte
	Retain      bool
	// Received is when the bridge read it from the broker.
	Received time.Time
	// Route names the route delivering it.
	Route string
	// Fence is the stamp of the tenure that received it (lease version
	// and session id); senders carry it to the destination (see package
	// fence). Zero for a non-exclusive session: nothing is stamped.
	Fence fence.Stamp
	// Properties are the message's MQTT 5 properties that MQTT senders
	// carry on; nil when it had none.
	Properties *Properties
	// Tenure, if set, is the lease tenure that received the message. Once
	// it is no longer valid the message counts as withdrawn: the owner
	// lost the right to act, so no sender starts delivering it.
	Tenure fence.Tenure

	withdrawn atomic.Bool
}

// Properties are the MQTT 5 properties of a received message that the
// bridge carries through to an MQTT destination.
type Properties struct {
	// User are the user properties in their order (keys may repeat).
	User []UserProperty
	// ContentType and PayloadFormat (0 bytes, 1 UTF-8; nil when absent)
	// describe the payload.
	ContentType   string
	PayloadFormat *byte
	// MessageExpiry is the expiry interval as received (seconds; nil for
	// none). The MQTT sender publishes what remains of it after the time
	// since Received, and does not publish a message that has expired.
	MessageExpiry *uint32
	// ResponseTopic is already mapped by the route like the topic;
	// CorrelationData is passed as is.
	ResponseTopic   string
	CorrelationData []byte
}

// UserProperty is one MQTT 5 user property.
type UserProperty struct{ Key, Value string }

// SetWithdrawn marks m withdrawn (true) or wanted again (false). The route
// withdraws the messages it has handed to a sender when an earlier message
// of the same topic failed: they must wait until that one is delivered or
// dead-lettered, so that the topic's order survives the retry.
func (m *Message) SetWithdrawn(w bool) { m.withdrawn.Store(w) }

// Withdrawn reports whether the route withdrew m, or the tenure that
// received m ended (its lease deadline passed: see Message.Tenure). A
// sender checks it just before it starts delivering m — the point of
// action — and fails a withdrawn m with ErrWithdrawn instead of delivering
// it. A message already on its way is not recalled.
func (m *Message) Withdrawn() bool {
	return m.withdrawn.Load() || (m.Tenure != nil && !m.Tenure.Valid())
}

// TenureCheck is Message.Withdrawn for a batch a sender is about to start:
// it asks each tenure whether it is still valid once, not once per message
// (a tenure check reads CLOCK_BOOTTIME, a system call where the vDSO
// cannot). Use a fresh one per batch, right before the batch's write, so
// that the check stays at the point of action. Tenure values must be comparable (lease.Ownership
// is a pointer).
type TenureCheck struct {
	tenure fence.Tenure
	ok     bool
}

// Withdrawn reports whether m was withdrawn or its tenure is no longer
// valid.
func (c *TenureCheck) Withdrawn(m *Message) bool {
	if m.withdrawn.Load() {
		return true
	}
	if m.Tenure == nil {
		return false
	}
	if c.tenure == nil || m.Tenure != c.tenure {
		c.tenure, c.ok = m.Tenure, m.Tenure.Valid()
	}
	return !c.ok
}

// Sender delivers messages to one destination.
//
// Send hands m to the destination and calls done exactly once: with nil
// when the destination has accepted m (written, acknowledged or flushed,
// as each kind documents), or with the reason it did not. done may run
// before Send returns or later on another goroutine. Messages sent from one
// goroutine are delivered in the order sent, so that per-topic order
// survives the bridge. Send must not block for long: a sender that cannot
// keep up queues, and the route's in-flight bound is the backpressure.
type Sender interface {
	Send(m *Message, done func(error))
	// Close stops the sender, failing what it has not delivered, and
	// waits for its goroutines within ctx.
	Close(ctx context.Context) error
}

// ErrClosed fails messages sent to, or pending in, a closed sender.
var ErrClosed = errors.New("sender closed")

// ErrWithdrawn fails a message that the sender did not attempt because it
// was withdrawn (see Message.Withdrawn) or because an earlier message of
// its topic in the same batch failed. It does not count as an attempt.
var ErrWithdrawn = errors.New("sender: not attempted: an earlier message of the topic failed")

// Permanent marks err as a failure that a retry of the same message cannot
// cure (the destination refused the message itself); the route
// dead-letters the message without spending its remaining attempts.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err, or an error it wraps, is Permanent.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

type permanentError struct{ err error }

func (p permanentError) Error() string { return p.err.Error() }
func (p permanentError) Unwrap() error { return p.err }

type item struct {
	m    *Message
	done func(error)
}

// Batch is a Sender for destinations that deliver synchronously. One
// goroutine takes what has queued, up to MaxBatch messages, hands them to
// the deliver function in order and reports each result: a file is written
// once per batch, a NATS connection flushed once per batch. Messages
// withdrawn by then fail with ErrWithdrawn without reaching deliver. A
// deliver function that fails one message must not deliver the later
// messages of its topic in the same batch (fail them, or ErrWithdrawn).
type Batch struct {
	deliver  func(ctx context.Context, ms []*Message) []error
	maxBatch int

	mu     sync.Mutex
	queue  []item
	closed bool
	kick   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// NewBatch starts the delivering goroutine; Close stops it. deliver
// returns one error per message (nil: accepted), or a shorter slice whose
// single element fails the whole batch.
func NewBatch(maxBatch int, deliver func(ctx context.Context, ms []*Message) []error) *Batch {
	ctx, cancel := context.WithCancel(context.Background())
	b := &Batch{deliver: deliver, maxBatch: max(1, maxBatch), kick: make(chan struct{}, 1), ctx: ctx, cancel: cancel, done: make(chan struct{})}
	go b.run()
	return b
}

// Send queues m.
func (b *Batch) Send(m *Message, done func(error)) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		done(ErrClosed)
		return
	}
	b.queue = append(b.queue, item{m, done})
	b.mu.Unlock()
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

func (b *Batch) run() {
	defer close(b.done)
	ms := make([]*Message, 0, b.maxBatch)
	for {
		select {
		case <-b.ctx.Done():
			b.failQueued()
			return
		case <-b.kick:
		}
		for {
			b.mu.Lock()
			n := min(len(b.queue), b.maxBatch)
			batch := append([]item(nil), b.queue[:n]...)
			b.queue = b.queue[n:]
			if len(b.queue) == 0 {
				b.queue = nil
			}
			b.mu.Unlock()
			if n == 0 {
				break
			}
			// Withdrawn messages fail without an attempt; the rest keep
			// their order.
			var check TenureCheck
			kept := batch[:0]
			for _, it := range batch {
				if check.Withdrawn(it.m) {
					it.done(ErrWithdrawn)
					continue
				}
				kept = append(kept, it)
			}
			batch = kept
			if len(batch) == 0 {
				continue
			}
			ms = ms[:0]
			for _, it := range batch {
				ms = append(ms, it.m)
			}
			errs := b.deliver(b.ctx, ms)
			for i, it := range batch {
				var err error
				switch {
				case len(errs) == len(batch):
					err = errs[i]
				case len(errs) > 0:
					err = errs[0]
				}
				it.done(err)
			}
			if b.ctx.Err() != nil {
				b.failQueued()
				return
			}
		}
	}
}

func (b *Batch) failQueued() {
	b.mu.Lock()
	q := b.queue
	b.queue = nil
	b.closed = true
	b.mu.Unlock()
	for _, it := range q {
		it.done(ErrClosed)
	}
}

// Close stops accepting, lets the current batch finish within ctx, and
// fails what is still queued.
func (b *Batch) Close(ctx context.Context) error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	select {
	case b.kick <- struct{}{}:
	default:
	}
	// Let the queue drain while ctx allows, then cancel.
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		b.mu.Lock()
		empty := len(b.queue) == 0
		b.mu.Unlock()
		if empty {
			break
		}
		select {
		case <-ctx.Done():
			b.cancel()
			<-b.done
			return ctx.Err()
		case <-t.C:
		}
	}
	b.cancel()
	<-b.done
	return nil
}
