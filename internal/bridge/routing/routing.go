// Package routing delivers received messages through routes to their
// senders, at least once.
//
// A message is acknowledged to the broker only after every sender of every
// route it matched has accepted it, or — once a sender's retries are spent
// — after it was written to the dead-letter file with the reason. Nothing
// is dropped silently: when even the dead-letter write fails, the message
// stays unacknowledged and is retried. Each route bounds the messages it
// holds (max_in_flight); a full route blocks the session's handler, which
// stops reading from the broker: backpressure, not unbounded memory.
//
// Messages reach each sender in the order the session received them; only
// a retried message can fall behind later ones.
package routing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/metrics"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/transport/mqtt"
)

// Target is one sender of a route with its retry policy.
type Target struct {
	ID             string
	Sender         sender.Sender
	MaxAttempts    int
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
}

// RouteConfig configures a Route.
type RouteConfig struct {
	ID          string
	Filters     []string // the receiver's topic filters
	Targets     []Target
	MaxInFlight int
	StripPrefix string
	AddPrefix   string
	DeadLetter  *DeadLetter
	Metrics     *metrics.Bridge
	Logger      *slog.Logger
}

// Route delivers the messages of one receiver to its senders.
type Route struct {
	cfg   RouteConfig
	log   *slog.Logger
	slots chan struct{}

	mu     sync.Mutex
	closed bool
	timers map[*time.Timer]struct{}
	wg     sync.WaitGroup
	quit   chan struct{}

	inFlight atomic.Int64
}

// NewRoute creates a route; Close stops its retries.
func NewRoute(cfg RouteConfig) *Route {
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 1000
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	for i := range cfg.Targets {
		t := &cfg.Targets[i]
		t.MaxAttempts = max(1, t.MaxAttempts)
		if t.InitialBackoff <= 0 {
			t.InitialBackoff = 100 * time.Millisecond
		}
		t.MaxBackoff = max(t.MaxBackoff, t.InitialBackoff)
	}
	return &Route{cfg: cfg, log: cfg.Logger.With("route", cfg.ID), slots: make(chan struct{}, cfg.MaxInFlight),
		timers: map[*time.Timer]struct{}{}, quit: make(chan struct{})}
}

// ID names the route.
func (r *Route) ID() string { return r.cfg.ID }

// InFlight is the number of messages the route holds.
func (r *Route) InFlight() int64 { return r.inFlight.Load() }

// Matches reports whether the route's receiver subscribed to topic.
func (r *Route) Matches(topic string) bool {
	for _, f := range r.cfg.Filters {
		if mqtt.Match(f, topic) {
			return true
		}
	}
	return false
}

// Rewrite applies the route's topic rewrite.
func (r *Route) Rewrite(topic string) string {
	if r.cfg.StripPrefix != "" {
		topic = strings.TrimPrefix(topic, r.cfg.StripPrefix)
	}
	return r.cfg.AddPrefix + topic
}

// ErrClosed is returned by Deliver on a closed route.
var ErrClosed = errors.New("route closed")

// Deliver takes m once a slot is free (blocking while the route is full)
// and calls settled exactly once when every sender accepted it or it was
// dead-lettered. It returns ErrClosed, without calling settled, when the
// route closes before a slot frees.
func (r *Route) Deliver(m *mqtt.Message, settled func()) error {
	select {
	case r.slots <- struct{}{}:
	case <-r.quit:
		return ErrClosed
	}
	r.inFlight.Add(1)
	r.cfg.Metrics.InFlight.WithLabelValues(r.cfg.ID).Inc()
	r.cfg.Metrics.In.WithLabelValues(r.cfg.ID).Inc()
	msg := &sender.Message{Topic: r.Rewrite(m.Topic), SourceTopic: m.Topic, Payload: m.Payload, QoS: m.QoS,
		Retain: m.Retain, Received: m.Received, Route: r.cfg.ID}
	var pending atomic.Int32
	pending.Store(int32(len(r.cfg.Targets)))
	finish := func() {
		if pending.Add(-1) == 0 {
			r.inFlight.Add(-1)
			r.cfg.Metrics.InFlight.WithLabelValues(r.cfg.ID).Dec()
			<-r.slots
			settled()
		}
	}
	for i := range r.cfg.Targets {
		r.send(&r.cfg.Targets[i], msg, 1, finish)
	}
	return nil
}

func (r *Route) send(t *Target, m *sender.Message, attempt int, finish func()) {
	t.Sender.Send(m, func(err error) {
		if err == nil {
			r.cfg.Metrics.Out.WithLabelValues(r.cfg.ID, t.ID).Inc()
			finish()
			return
		}
		r.cfg.Metrics.Failed.WithLabelValues(r.cfg.ID, t.ID).Inc()
		if attempt >= t.MaxAttempts {
			reason := fmt.Sprintf("%d attempts failed; last error: %v", attempt, err)
			if dlErr := r.cfg.DeadLetter.Write(r.cfg.ID, t.ID, m, reason, attempt); dlErr != nil {
				r.log.Error("dead-letter write failed; the message stays unacknowledged and is retried", "sender", t.ID, "topic", m.Topic, "err", dlErr)
				r.later(t.MaxBackoff, func() { r.send(t, m, attempt, finish) })
				return
			}
			r.cfg.Metrics.DeadLettered.WithLabelValues(r.cfg.ID, t.ID).Inc()
			r.log.Warn("message dead-lettered", "sender", t.ID, "topic", m.Topic, "reason", reason)
			finish()
			return
		}
		backoff := t.InitialBackoff << min(attempt-1, 20)
		backoff = min(backoff, t.MaxBackoff)
		r.log.Debug("delivery failed; retrying", "sender", t.ID, "attempt", attempt, "backoff", backoff, "err", err)
		r.later(backoff, func() { r.send(t, m, attempt+1, finish) })
	})
}

// later runs f after d unless the route closes first; a message whose
// retry is cancelled stays unacknowledged, so the broker redelivers it.
func (r *Route) later(d time.Duration, f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.wg.Add(1)
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		defer r.wg.Done()
		r.mu.Lock()
		delete(r.timers, t)
		closed := r.closed
		r.mu.Unlock()
		if !closed {
			f()
		}
	})
	r.timers[t] = struct{}{}
}

// Close cancels pending retries and unblocks Deliver. Messages in flight
// stay unacknowledged.
func (r *Route) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	close(r.quit)
	for t := range r.timers {
		if t.Stop() {
			r.wg.Done()
		}
		delete(r.timers, t)
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// WaitIdle waits until the route holds no message or ctx ends.
func (r *Route) WaitIdle(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for r.inFlight.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// Dispatcher is a session's handler: it hands each message to every route
// whose receiver matches and acknowledges it when all of them settled.
type Dispatcher struct {
	Session string
	Routes  []*Route
	Metrics *metrics.Bridge
}

// Handle implements mqtt.Handler.
func (d *Dispatcher) Handle(m *mqtt.Message, ack func()) {
	var matched []*Route
	for _, r := range d.Routes {
		if r.Matches(m.Topic) {
			matched = append(matched, r)
		}
	}
	if len(matched) == 0 {
		if d.Metrics != nil {
			d.Metrics.Unroutable.WithLabelValues(d.Session).Inc()
		}
		ack()
		return
	}
	var pending atomic.Int32
	pending.Store(int32(len(matched)))
	settled := func() {
		if pending.Add(-1) == 0 {
			ack()
		}
	}
	for _, r := range matched {
		if err := r.Deliver(m, settled); err != nil {
			return // closing: leave it unacknowledged
		}
	}
}

// DeadLetter is the dead-letter file: one JSON object per line.
type DeadLetter struct {
	mu   sync.Mutex
	path string
	f    *os.File
}

// DeadLetterEntry is one line of the dead-letter file.
type DeadLetterEntry struct {
	Time        time.Time `json:"time"`
	Route       string    `json:"route"`
	Sender      string    `json:"sender"`
	Topic       string    `json:"topic"`
	SourceTopic string    `json:"source_topic"`
	QoS         byte      `json:"qos"`
	Payload     []byte    `json:"payload"`
	Attempts    int       `json:"attempts"`
	Reason      string    `json:"reason"`
}

// OpenDeadLetter opens (lazily creating) the dead-letter file at path.
func OpenDeadLetter(path string) *DeadLetter { return &DeadLetter{path: path} }

// Write appends an entry and syncs the file; a nil DeadLetter refuses.
func (d *DeadLetter) Write(route, senderID string, m *sender.Message, reason string, attempts int) error {
	if d == nil {
		return errors.New("no dead-letter file configured")
	}
	b, err := json.Marshal(DeadLetterEntry{Time: time.Now().UTC(), Route: route, Sender: senderID, Topic: m.Topic,
		SourceTopic: m.SourceTopic, QoS: m.QoS, Payload: m.Payload, Attempts: attempts, Reason: reason})
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.f == nil {
		f, err := os.OpenFile(d.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
		if err != nil {
			return err
		}
		d.f = f
	}
	if _, err := d.f.Write(append(b, '\n')); err != nil {
		return err
	}
	return d.f.Sync()
}

// Close closes the file.
func (d *DeadLetter) Close() error {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.f == nil {
		return nil
	}
	err := d.f.Close()
	d.f = nil
	return err
}
