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
// Per-topic order survives retries: messages reach each sender in the
// order the session received them, and when one fails, the later messages
// of its topic wait for it (head-of-line per route, sender and topic)
// until it is delivered or dead-lettered; other topics flow on. Messages
// that a sender had already started when the failure was reported are not
// recalled (see Route). A failure the sender marks permanent
// (sender.Permanent) is dead-lettered without further attempts.
package routing

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/myriarch/myriarch/internal/bridge/deadletter"
	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/metrics"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/transport"
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
	// Mappings, if set, replace StripPrefix/AddPrefix: the route takes
	// only messages that match one of them, and the first that matches
	// maps the topic.
	Mappings   []Mapping
	DeadLetter *DeadLetter
	Metrics    *metrics.Bridge
	Logger     *slog.Logger
	// Fence is stamped on every message the route hands to a sender
	// (zero for a non-exclusive session).
	Fence fence.Stamp
	// Retain is what the route does with a message that carries the
	// retain flag (default RetainKeep).
	Retain RetainPolicy
	// LoopPeer, if set, names the route that bridges the opposite
	// direction between the same two brokers (a loop pair). The route
	// stamps what it publishes with the user property HopProperty set to
	// its own ID, and does not take a message stamped with LoopPeer: its
	// peer published it, so sending it back would echo it forever. It is
	// opt-in because the stamp is only a loop when it comes back from the
	// peer: a route chained after this one (this route's destination is
	// its source) must still take what this route published.
	LoopPeer string
	// Tenure, if set, is the lease tenure the route works for. A message
	// that had to wait for a slot is not taken once the tenure is invalid
	// (the transport checks at intake), a lane of an ended tenure sends
	// nothing more, and the senders check the tenure just before they
	// deliver (sender.Message.Tenure).
	Tenure fence.Tenure
	// Spool, if set, is the route's durable spool (see spool.go): the
	// dispatcher appends each message to it and acknowledges the source
	// at once, and the route delivers from the spool.
	Spool Spool
}

// Mapping is one topic mapping of a route, as in mosquitto's bridge
// "topic <pattern> <direction> <qos> <local-prefix> <remote-prefix>": a
// message on SourcePrefix+<topic matching Pattern> is delivered as
// DestinationPrefix+<that topic>.
type Mapping struct {
	Pattern, SourcePrefix, DestinationPrefix string
}

// HopProperty is the MQTT 5 user property that a route of a loop pair
// (RouteConfig.LoopPeer) stamps on what it publishes: its value is the
// publishing route's ID.
const HopProperty = "myriarch-bridge-hop"

// RetainPolicy is a route's handling of retained messages: those the
// broker sends when the session subscribes and live ones published with
// the retain flag (the receiver subscribes with Retain As Published).
type RetainPolicy string

// Retain policies.
const (
	// RetainKeep forwards the message with its retain flag.
	RetainKeep RetainPolicy = "keep"
	// RetainClear forwards the message without the retain flag, so that
	// the destination broker stores nothing.
	RetainClear RetainPolicy = "clear"
	// RetainDrop does not forward the message; it is acknowledged.
	RetainDrop RetainPolicy = "drop"
)

// Route delivers the messages of one receiver to its senders.
//
// Per sender, a route keeps each topic's unsettled messages in a lane. An
// open lane hands every message to the sender as it arrives (pipelined).
// The first failure blocks the lane: the topic's messages still queued at
// the sender are withdrawn (sender.Message.SetWithdrawn; the sender fails
// them with sender.ErrWithdrawn instead of delivering them, but cannot
// recall one it has already started), later messages wait in the lane,
// and the failed message is retried alone after its backoff until it is
// accepted or dead-lettered. Then the lane opens and what waited is sent
// in order. Waiting messages hold their in-flight slots.
type Route struct {
	cfg     RouteConfig
	log     *slog.Logger
	slots   chan struct{}
	targets []*target

	mu     sync.Mutex
	closed atomic.Bool // written under mu
	timers map[*time.Timer]struct{}
	wg     sync.WaitGroup
	quit   chan struct{}

	inFlight atomic.Int64
	rewrites [64]atomic.Pointer[rewritten]

	// The spool pump (spool.go); nil without a spool.
	pump *pump

	// The route's metric series, resolved once.
	mIn       prometheus.Counter
	mInFlight prometheus.Gauge
	mLoop     prometheus.Counter
}

// target is one sender of the route with its lanes: per topic, the
// messages it has not yet settled, in arrival order.
//
// A lane is open while its messages succeed: each is handed to the sender
// as it arrives, pipelined. The first real failure blocks the lane: the
// messages of the topic still at the sender are withdrawn (a sender fails
// those it has not started with ErrWithdrawn), new ones wait in the lane,
// and once nothing of the topic is at the sender the head is retried
// alone after its backoff, until it is delivered or dead-lettered. Then
// the lane opens and what waited is sent in order. Other topics flow on.
//
// Send is never called with mu held (a sender may call done before Send
// returns). Messages to send are queued in outbox under mu, and whoever
// finds nobody sending hands the outbox to the sender in order, so that
// the sender sees each lane's messages in the order decided under mu.
type target struct {
	cfg   *Target
	route *Route

	mOut, mFailed prometheus.Counter

	mu       sync.Mutex
	lanes    map[string]*lane
	freeLane *lane // an emptied lane kept for the next topic
	outbox   []*delivery
	spare    []*delivery
	sending  bool
}

type lane struct {
	items   []*delivery // unsettled, in arrival order
	blocked bool
	timer   bool // a retry of the head is scheduled
	// dues: some item may have due set. Progress clears the items' due
	// only then: walking every item on each settled head cost time in
	// proportion to the messages in flight (a fifth of the bridge's own
	// code at 1,000 in flight on one topic).
	dues bool
}

// delivery is one message on its way to one target.
type delivery struct {
	msg sender.Message // this target's copy: it carries the withdrawal
	t   *target
	set *settlement // the message's, shared by its targets' deliveries
	own settlement  // set for a route with one target: no allocation of its own

	// Under t.mu.
	sent     bool // at the sender, result pending
	attempts int  // failed attempts
	due      bool // failed since its lane last made progress: back off
}

// settlement counts the targets that have yet to settle one message; the
// last one frees the message's slot and calls settled.
type settlement struct {
	pending atomic.Int32
	r       *Route
	settled func()
}

func (g *settlement) finish() {
	if g.pending.Add(-1) == 0 {
		r := g.r
		r.inFlight.Add(-1)
		r.mInFlight.Dec()
		<-r.slots
		g.settled()
	}
}

// rewritten is one entry of a route's cache of rewritten topics.
type rewritten struct{ src, dst string }

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
	r := &Route{cfg: cfg, log: cfg.Logger.With("route", cfg.ID), slots: make(chan struct{}, cfg.MaxInFlight),
		timers: map[*time.Timer]struct{}{}, quit: make(chan struct{}),
		mIn: cfg.Metrics.In.WithLabelValues(cfg.ID), mInFlight: cfg.Metrics.InFlight.WithLabelValues(cfg.ID),
		mLoop: cfg.Metrics.LoopDropped.WithLabelValues(cfg.ID)}
	for i := range r.cfg.Targets {
		t := &r.cfg.Targets[i]
		t.MaxAttempts = max(1, t.MaxAttempts)
		if t.InitialBackoff <= 0 {
			t.InitialBackoff = 100 * time.Millisecond
		}
		t.MaxBackoff = max(t.MaxBackoff, t.InitialBackoff)
		r.targets = append(r.targets, &target{cfg: t, route: r, lanes: map[string]*lane{},
			mOut: cfg.Metrics.Out.WithLabelValues(cfg.ID, t.ID), mFailed: cfg.Metrics.Failed.WithLabelValues(cfg.ID, t.ID)})
	}
	if cfg.Spool != nil {
		r.startPump()
	}
	return r
}

// ID names the route.
func (r *Route) ID() string { return r.cfg.ID }

// InFlight is the number of messages the route holds.
func (r *Route) InFlight() int64 { return r.inFlight.Load() }

// Matches reports whether the route's receiver subscribed to topic and,
// for a route with mappings, whether one of them maps it.
func (r *Route) Matches(topic string) bool {
	for _, f := range r.cfg.Filters {
		if transport.Match(f, topic) {
			if len(r.cfg.Mappings) == 0 {
				return true
			}
			_, ok := r.mapped(topic)
			return ok
		}
	}
	return false
}

// mapped applies the first mapping that matches topic.
func (r *Route) mapped(topic string) (string, bool) {
	for _, m := range r.cfg.Mappings {
		if transport.Match(m.SourcePrefix+m.Pattern, topic) {
			return m.DestinationPrefix + strings.TrimPrefix(topic, m.SourcePrefix), true
		}
	}
	return topic, false
}

// Rewrite applies the route's topic rewrite: its first matching mapping
// (a topic that none maps is returned as is), or its strip and add
// prefixes.
func (r *Route) Rewrite(topic string) string {
	if len(r.cfg.Mappings) > 0 {
		t, _ := r.mapped(topic)
		return t
	}
	if r.cfg.StripPrefix != "" {
		topic = strings.TrimPrefix(topic, r.cfg.StripPrefix)
	}
	return r.cfg.AddPrefix + topic
}

// rewriteCached is Rewrite through a small cache, so that a topic seen
// again costs no new string: a direct-mapped table by the topic's hash,
// safe for concurrent use.
func (r *Route) rewriteCached(topic string) string {
	if len(r.cfg.Mappings) == 0 && r.cfg.StripPrefix == "" && r.cfg.AddPrefix == "" {
		return topic
	}
	slot := &r.rewrites[maphash.String(rewriteSeed, topic)%uint64(len(r.rewrites))]
	if c := slot.Load(); c != nil && c.src == topic {
		return c.dst
	}
	dst := r.Rewrite(topic)
	// The source topic may point into a received packet (package
	// mqtt): the cache keeps a copy, not the packet.
	slot.Store(&rewritten{src: strings.Clone(topic), dst: dst})
	return dst
}

var rewriteSeed = maphash.MakeSeed()

// ErrClosed is returned by Deliver on a closed route.
var ErrClosed = errors.New("route closed")

// ErrTenureEnded is returned by Deliver when the route's tenure ended
// while the message waited for a slot: it stays unacknowledged for the
// next owner.
var ErrTenureEnded = errors.New("route: the lease tenure ended")

// valid reports whether the route's tenure may still act.
func (r *Route) valid() bool { return r.cfg.Tenure == nil || r.cfg.Tenure.Valid() }

// Deliver takes m once a slot is free (blocking while the route is full)
// and calls settled exactly once when every sender accepted it or it was
// dead-lettered. It returns ErrClosed, without calling settled, when the
// route closes before a slot frees. Deliver is called from one goroutine:
// each sender receives a topic's messages in the order of these calls.
func (r *Route) Deliver(m *transport.Message, settled func()) error {
	// The transport checked the tenure just before it called the handler
	// (intake); the route checks again only after it had to wait.
	if m.Retain && r.cfg.Retain == RetainDrop {
		settled()
		return nil
	}
	if r.fromPeer(m) {
		// The peer route published it on this route's source broker: it
		// has already been bridged in the other direction.
		r.mLoop.Inc()
		settled()
		return nil
	}
	select {
	case r.slots <- struct{}{}:
	default:
		// Full: wait for a slot, then check the tenure again, since the
		// wait may have outlasted it.
		select {
		case r.slots <- struct{}{}:
		case <-r.quit:
			return ErrClosed
		}
		if !r.valid() {
			<-r.slots
			return ErrTenureEnded
		}
	}
	if r.closed.Load() {
		<-r.slots
		return ErrClosed
	}
	r.inFlight.Add(1)
	r.mInFlight.Inc()
	r.mIn.Inc()
	topic := r.rewriteCached(m.Topic)
	retain := m.Retain && r.cfg.Retain != RetainClear
	props := m.Properties
	if props != nil && props.ResponseTopic != "" {
		// The response topic names a topic on the source side: the
		// destination's responders see it mapped like the topic.
		c := *props
		c.ResponseTopic = r.Rewrite(props.ResponseTopic)
		props = &c
	}
	if r.cfg.LoopPeer != "" {
		props = r.stampHop(props)
	}
	var shared *settlement
	if len(r.targets) > 1 {
		shared = &settlement{r: r, settled: settled}
		shared.pending.Store(int32(len(r.targets)))
	}
	for _, t := range r.targets {
		d := &delivery{t: t, set: shared, msg: sender.Message{Topic: topic, SourceTopic: m.Topic, Payload: m.Payload,
			QoS: m.QoS, Retain: retain, Received: m.Received, Properties: props, Route: r.cfg.ID, Fence: r.cfg.Fence, Tenure: r.cfg.Tenure}}
		if shared == nil {
			d.own.r, d.own.settled = r, settled
			d.own.pending.Store(1)
			d.set = &d.own
		}
		t.mu.Lock()
		l := t.lanes[topic]
		if l == nil {
			if l = t.freeLane; l != nil {
				t.freeLane = nil
			} else {
				l = &lane{}
			}
			t.lanes[topic] = l
		}
		l.items = append(l.items, d)
		if !l.blocked {
			d.sent = true
			t.outbox = append(t.outbox, d)
		}
		r.flush(t) // unlocks t.mu
	}
	return nil
}

// fromPeer reports whether m carries the hop stamp of the route's loop
// peer.
func (r *Route) fromPeer(m *transport.Message) bool {
	if r.cfg.LoopPeer == "" || m.Properties == nil {
		return false
	}
	for _, u := range m.Properties.User {
		if u.Key == HopProperty && u.Value == r.cfg.LoopPeer {
			return true
		}
	}
	return false
}

// stampHop returns a copy of props (nil: none) whose hop stamp is the
// route's ID, replacing any the message arrived with: a message carries
// the route that published it last, so that a pair further down a chain
// recognises its own peer.
func (r *Route) stampHop(props *sender.Properties) *sender.Properties {
	var c sender.Properties
	if props != nil {
		c = *props
	}
	c.User = make([]sender.UserProperty, 0, len(c.User)+1)
	if props != nil {
		for _, u := range props.User {
			if u.Key != HopProperty {
				c.User = append(c.User, u)
			}
		}
	}
	c.User = append(c.User, sender.UserProperty{Key: HopProperty, Value: r.cfg.ID})
	return &c
}

// flush hands the outbox to the sender unless another goroutine already
// does; it is called with t.mu held and returns with it released.
func (r *Route) flush(t *target) {
	if t.sending {
		t.mu.Unlock()
		return
	}
	t.sending = true
	for len(t.outbox) > 0 {
		batch := t.outbox
		t.outbox = t.spare[:0]
		t.mu.Unlock()
		for _, d := range batch {
			t.cfg.Sender.Send(&d.msg, d.done)
		}
		clear(batch)
		t.mu.Lock()
		t.spare = batch[:0]
	}
	t.sending = false
	t.mu.Unlock()
}

// done is the sender's verdict on one attempt.
func (d *delivery) done(err error) {
	t, r := d.t, d.t.route
	withdrawn := err != nil && errors.Is(err, sender.ErrWithdrawn)
	settle := err == nil
	if err != nil && !withdrawn {
		t.mFailed.Inc()
		t.mu.Lock()
		d.attempts++
		attempts := d.attempts
		t.mu.Unlock()
		if attempts >= t.cfg.MaxAttempts || sender.IsPermanent(err) {
			reason := fmt.Sprintf("%d attempts failed; last error: %v", attempts, err)
			if sender.IsPermanent(err) && attempts < t.cfg.MaxAttempts {
				reason = fmt.Sprintf("permanent failure after %d attempts: %v", attempts, err)
			}
			if dlErr := r.cfg.DeadLetter.Write(r.cfg.ID, t.cfg.ID, &d.msg, reason, attempts); dlErr != nil {
				r.log.Error("dead-letter write failed; the message stays unacknowledged and is retried", "sender", t.cfg.ID, "topic", d.msg.Topic, "err", dlErr)
			} else {
				r.cfg.Metrics.DeadLettered.WithLabelValues(r.cfg.ID, t.cfg.ID).Inc()
				r.log.Warn("message dead-lettered", "sender", t.cfg.ID, "topic", d.msg.Topic, "reason", reason)
				settle = true
			}
		} else {
			r.log.Debug("delivery failed; retrying", "sender", t.cfg.ID, "topic", d.msg.Topic, "attempt", attempts, "err", err)
		}
	}
	if err == nil {
		t.mOut.Inc()
	}

	t.mu.Lock()
	d.sent = false
	l := t.lanes[d.msg.Topic]
	switch {
	case settle:
		head := l.items[0] == d
		l.items = removeItem(l.items, d)
		if head && l.dues {
			// Progress: what failed alongside the head goes without a
			// further backoff.
			for _, o := range l.items {
				o.due = false
			}
			l.dues = false
		}
	default:
		// A failure, or a withdrawal this lane did not ask for (a sender
		// shared with another route skipped the topic after that route's
		// failure): hold the lane either way, so nothing overtakes d.
		if !withdrawn {
			d.due, l.dues = true, true
		}
		if !l.blocked {
			l.blocked = true
			for _, o := range l.items {
				if o.sent {
					o.msg.SetWithdrawn(true)
				}
			}
		}
	}
	r.advance(t, d.msg.Topic, l)
	r.flush(t)
	if settle {
		d.set.finish()
	}
}

func removeItem(items []*delivery, d *delivery) []*delivery {
	for i, o := range items {
		if o == d {
			if len(items) == 1 {
				// Keep the array: the lane's next message reuses it.
				items[0] = nil
				return items[:0]
			}
			if i == 0 {
				items[0] = nil
				return items[1:]
			}
			copy(items[i:], items[i+1:])
			items[len(items)-1] = nil
			return items[:len(items)-1]
		}
	}
	return items
}

// advance moves a blocked lane on, with t.mu held: nothing happens while
// any of its messages is at the sender or a retry is scheduled; a head
// that failed is retried alone after its backoff; otherwise the lane
// opens and everything waiting is sent in order. An empty lane is removed.
func (r *Route) advance(t *target, topic string, l *lane) {
	if len(l.items) == 0 {
		if !l.timer {
			delete(t.lanes, topic)
			if t.freeLane == nil {
				l.items, l.blocked, l.dues = l.items[:0], false, false
				t.freeLane = l
			}
		}
		return
	}
	if !l.blocked || l.timer || r.closed.Load() || !r.valid() {
		// A tenure that ended sends nothing more: what the lane holds
		// stays unacknowledged for the next owner.
		return
	}
	for _, d := range l.items {
		if d.sent {
			return
		}
	}
	head := l.items[0]
	if !head.due {
		l.blocked = false
		for _, d := range l.items {
			d.msg.SetWithdrawn(false)
			d.sent = true
			t.outbox = append(t.outbox, d)
		}
		return
	}
	backoff := t.cfg.MaxBackoff
	if head.attempts < t.cfg.MaxAttempts {
		backoff = min(t.cfg.InitialBackoff<<min(head.attempts-1, 20), t.cfg.MaxBackoff)
	}
	l.timer = r.later(backoff, func() {
		t.mu.Lock()
		l.timer = false
		if cur := t.lanes[topic]; cur != l || len(l.items) == 0 {
			if len(l.items) == 0 && cur == l {
				delete(t.lanes, topic)
			}
			t.mu.Unlock()
			return
		}
		head := l.items[0]
		if !head.sent {
			head.due = false
			head.msg.SetWithdrawn(false)
			head.sent = true
			t.outbox = append(t.outbox, head)
		}
		r.flush(t)
	})
}

// later runs f after d unless the route closes first, and reports whether
// it was scheduled; a message whose retry is cancelled stays
// unacknowledged, so the broker redelivers it.
func (r *Route) later(d time.Duration, f func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed.Load() {
		return false
	}
	r.wg.Add(1)
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		defer r.wg.Done()
		r.mu.Lock()
		delete(r.timers, t)
		closed := r.closed.Load()
		r.mu.Unlock()
		if !closed {
			f()
		}
	})
	r.timers[t] = struct{}{}
	return true
}

// Close cancels pending retries, withdraws every message the route still
// holds (a sender that has not started one will not) and unblocks
// Deliver. Messages in flight stay unacknowledged.
func (r *Route) Close() {
	r.mu.Lock()
	if r.closed.Load() {
		r.mu.Unlock()
		return
	}
	r.closed.Store(true)
	close(r.quit)
	r.stopPump()
	for t := range r.timers {
		if t.Stop() {
			r.wg.Done()
		}
		delete(r.timers, t)
	}
	r.mu.Unlock()
	// Outside r.mu: advance holds t.mu when it takes r.mu (later).
	for _, t := range r.targets {
		t.mu.Lock()
		for _, l := range t.lanes {
			for _, d := range l.items {
				d.msg.SetWithdrawn(true)
			}
		}
		t.mu.Unlock()
	}
	r.wg.Wait()
	r.waitPump()
}

// WaitIdle waits until the route holds no message or ctx ends. A route
// with a spool first stops taking messages from it: what the spool holds
// stays there for the next route.
func (r *Route) WaitIdle(ctx context.Context) error {
	if err := r.pausePump(ctx); err != nil {
		return err
	}
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
//
// The dispatcher does not check the lease tenure itself: the transport
// checks it before it calls Handle and before it sends an acknowledgment,
// and each route before it takes a message (see RouteConfig.Tenure).
type Dispatcher struct {
	Session string
	Routes  []*Route
	Metrics *metrics.Bridge
}

// Handle implements transport.Handler.
func (d *Dispatcher) Handle(m *transport.Message, ack func()) {
	var first *Route
	n := 0
	for _, r := range d.Routes {
		if r.Matches(m.Topic) {
			if n == 0 {
				first = r
			}
			n++
		}
	}
	switch n {
	case 0:
		if d.Metrics != nil {
			d.Metrics.Unroutable.WithLabelValues(d.Session).Inc()
		}
		ack()
		return
	case 1:
		// The common case: the route's settlement is the message's.
		_ = first.take(m, ack) // an error means closing: left unacknowledged
		return
	}
	matched := make([]*Route, 0, n)
	for _, r := range d.Routes {
		if r.Matches(m.Topic) {
			matched = append(matched, r)
		}
	}
	var pending atomic.Int32
	pending.Store(int32(len(matched)))
	settled := func() {
		if pending.Add(-1) == 0 {
			ack()
		}
	}
	for _, r := range matched {
		if err := r.take(m, settled); err != nil {
			return // closing: leave it unacknowledged
		}
	}
}

// DeadLetter is the dead-letter file; package deadletter owns its format,
// and the routes are its only writer.
type DeadLetter = deadletter.Writer

// DeadLetterEntry is one line of the dead-letter file.
type DeadLetterEntry = deadletter.Record

// OpenDeadLetter opens (lazily creating) the dead-letter file at path.
func OpenDeadLetter(path string) *DeadLetter { return deadletter.Open(path) }
