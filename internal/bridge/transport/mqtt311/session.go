// Package mqtt311 is the bridge's MQTT 3.1.1 receiving transport, on
// Eclipse Paho's paho.mqtt.golang client. A Session has the shape of the
// MQTT 5 transport's (package transport/mqtt, whose Config, Message,
// Handler, Level, Subscription and Match it uses): it connects, subscribes
// the configured filters, hands every message to one handler in arrival
// order, and acknowledges a QoS 1/2 message only when the handler says so,
// in the order the messages arrived, as MQTT requires.
//
// Activation is bounded like the MQTT 5 transport's and declares the same
// bound through Config.Activation: each connect attempt (dial, TLS,
// CONNECT, CONNACK) by connect_timeout, at most two; each SUBSCRIBE or
// UNSUBSCRIBE wait by reconcile_timeout, at most three of the four
// declared; the whole activation under a context that expires at
// 2·connect_timeout + 4·reconcile_timeout + 2·unmatched_grace. Paho's own
// reconnect and connect retry are off: they sleep and retry on their own
// schedule, outside that bound and outside the lease tenure checks, so
// the session drives every reconnect itself with a fresh client.
//
// What MQTT 3.1.1 lacks, and what the session does instead:
//   - no session expiry interval: CleanSession false keeps the broker
//     session for as long as the broker's own settings say;
//   - no receive maximum: the handler blocking is the backpressure (Paho
//     then stops reading the connection), the broker's in-flight limit
//     bounds what it sends unacknowledged;
//   - no Retain As Published and no Retain Handling: brokers clear the
//     retain flag of live messages, and send a filter's retained messages
//     at every SUBSCRIBE, also when a resumed session subscribes again;
//   - no properties: Message.Properties is always nil.
package mqtt311

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/myriarch/myriarch/internal/bridge/paho311"
	"github.com/myriarch/myriarch/internal/bridge/transport"
)

// ErrTenureEnded is returned by Run when the session's tenure is no longer
// valid (the MQTT 5 transport's error, so callers test one value).
var ErrTenureEnded = transport.ErrTenureEnded

// ErrActivation wraps an activation step that ran out of its time.
var ErrActivation = transport.ErrActivation

// Session is one MQTT 3.1.1 broker session. Create it with New, run it
// with Run.
type Session struct {
	cfg   transport.Config
	log   *slog.Logger
	level atomic.Int32

	draining  atomic.Bool
	unmatched atomic.Int64

	mu            sync.Mutex
	activatedAt   time.Time
	sessionResume bool
}

// New validates cfg and returns a session that is not yet connected. The
// MQTT 5 settings SessionExpiry and ReceiveMaximum do not apply; CleanStart is MQTT 3.1.1's CleanSession.
func New(cfg transport.Config) (*Session, error) {
	if len(cfg.Brokers) == 0 || cfg.ClientID == "" || cfg.Handler == nil {
		return nil, errors.New("mqtt 3.1.1 session: Brokers, ClientID and Handler are required")
	}
	if _, err := cfg.Activation(); err != nil {
		return nil, err
	}
	for _, b := range cfg.Brokers {
		if _, err := url.Parse(b); err != nil {
			return nil, fmt.Errorf("mqtt 3.1.1 session: broker %q: %w", b, err)
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Session{cfg: cfg, log: cfg.Logger.With("client_id", cfg.ClientID, "protocol", "3.1.1")}, nil
}

// Level returns the current service level.
func (s *Session) Level() transport.Level { return transport.Level(s.level.Load()) }

// Unmatched counts messages that matched no wanted filter (residue of
// removed subscriptions); they are acknowledged and dropped.
func (s *Session) Unmatched() int64 { return s.unmatched.Load() }

// SessionPresent reports whether the broker resumed a stored session on
// the latest connection.
func (s *Session) SessionPresent() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessionResume
}

// Drain stops handing new messages to the handler; they stay
// unacknowledged in the broker session for the next connection or owner.
func (s *Session) Drain() { s.draining.Store(true) }

func (s *Session) setLevel(l transport.Level) {
	if transport.Level(s.level.Swap(int32(l))) != l && s.cfg.OnLevel != nil {
		s.cfg.OnLevel(l)
	}
}

func (s *Session) valid() bool { return s.cfg.Tenure == nil || s.cfg.Tenure.Valid() }

// Run connects and serves until ctx ends, reconnecting with backoff after
// a loss. It returns when ctx ends, after a DISCONNECT that keeps the
// broker session (CleanSession false) for a successor, or with
// ErrTenureEnded once the tenure is invalid: it never connects after that.
func (s *Session) Run(ctx context.Context) error {
	return transport.Reconnect(ctx, s.cfg, s.valid, s.setLevel, s.connection, s.log)
}

// connection runs one connection: activation, then serving until loss.
func (s *Session) connection(ctx context.Context, attempt int) error {
	actCtx, actCancel := transport.ActivationContext(ctx, s.cfg)
	defer actCancel()

	lost := make(chan error, 1)
	var cli paho.Client
	var acks *acker
	err := transport.Dial(actCtx, s.cfg, attempt, s.valid, s.log, func(ctx context.Context, broker string) (err error) {
		acks = &acker{valid: s.valid}
		cli, err = s.connect(ctx, broker, acks, lost)
		return err
	})
	if err != nil {
		return err
	}
	defer func() {
		// Paho writes the released acknowledgments before the DISCONNECT
		// (one writer, in order); the quiesce bounds the wait for it.
		cli.Disconnect(250)
	}()
	err = transport.Activate(actCtx, s.cfg, s.state(), transport.Reconciler{
		SessionPresent: s.SessionPresent(),
		Unsubscribe:    func(ctx context.Context, filters []string) error { return s.wait(ctx, cli.Unsubscribe(filters...)) },
		Subscribe: func(ctx context.Context, subs []transport.Subscription) (map[string]bool, error) {
			return s.subscribe(ctx, cli, subs)
		},
	}, s.log, s.setLevel, s.activated)
	if err != nil {
		return err
	}

	select {
	case <-ctx.Done():
		return nil
	case err := <-lost:
		return err
	}
}

// wait waits for tok within reconcile_timeout.
func (s *Session) wait(ctx context.Context, tok paho.Token) error {
	wctx, cancel := context.WithTimeout(ctx, s.cfg.ReconcileTimeout)
	defer cancel()
	select {
	case <-tok.Done():
		return tok.Error()
	case <-wctx.Done():
		return fmt.Errorf("no answer within reconcile_timeout %v", s.cfg.ReconcileTimeout)
	}
}

// subscribe sends one SUBSCRIBE for subs and waits, within
// reconcile_timeout, for its SUBACK. MQTT 3.1.1 has no "packet identifier
// in use" reason: a broker that shares packet identifiers between
// directions (mochi-mqtt does) refuses a SUBSCRIBE whose identifier equals
// one of the messages it is redelivering to a resumed session with the
// plain failure code 0x80 for every filter. In a resumed session such a
// SUBACK is sent again at once (Paho moves to the next identifier), within
// the same timeout.
func (s *Session) subscribe(ctx context.Context, cli paho.Client, subs []transport.Subscription) (map[string]bool, error) {
	granted := map[string]bool{}
	if len(subs) == 0 {
		return granted, nil
	}
	sctx, cancel := context.WithTimeout(ctx, s.cfg.ReconcileTimeout)
	defer cancel()
	req := make(map[string]byte, len(subs))
	for _, sub := range subs {
		req[sub.Filter] = sub.QoS
	}
	for {
		tok := cli.SubscribeMultiple(req, nil)
		select {
		case <-tok.Done():
		case <-sctx.Done():
			return granted, fmt.Errorf("no SUBACK within reconcile_timeout %v", s.cfg.ReconcileTimeout)
		}
		if err := tok.Error(); err != nil {
			return granted, err
		}
		res := tok.(*paho.SubscribeToken).Result()
		allFailed := true
		for _, sub := range subs {
			if code, ok := res[sub.Filter]; ok && code < 0x80 {
				granted[sub.Filter] = true
				allFailed = false
			}
		}
		if !allFailed || !s.SessionPresent() || sctx.Err() != nil {
			if len(granted) < len(subs) {
				s.log.Warn("broker refused subscriptions", "result", res)
			}
			return granted, nil
		}
	}
}

// connect dials broker and completes CONNECT/CONNACK within
// connect_timeout, with a fresh Paho client whose own reconnect and retry
// are off.
func (s *Session) connect(ctx context.Context, broker string, acks *acker, lost chan<- error) (paho.Client, error) {
	opts := paho.NewClientOptions().
		SetCleanSession(s.cfg.CleanStart).
		SetKeepAlive(s.cfg.KeepAlive).
		SetResumeSubs(false).
		SetOrderMatters(true).    // one handler call at a time, in arrival order
		SetAutoAckDisabled(true). // acknowledged when the routes accepted it
		SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) { s.onMessage(m, acks) }).
		SetConnectionLostHandler(func(_ paho.Client, err error) {
			select {
			case lost <- err:
			default:
			}
		})
	cli, present, err := paho311.Connect(ctx, opts, paho311.Dial{Broker: broker, TLS: s.cfg.TLS, Username: s.cfg.Username,
		Password: s.cfg.Password, ClientID: s.cfg.ClientID, Timeout: s.cfg.ConnectTimeout})
	if errors.Is(err, paho311.ErrConnectTimeout) {
		return nil, fmt.Errorf("%w: %v", ErrActivation, err)
	}
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.sessionResume = present
	s.mu.Unlock()
	s.log.Info("mqtt connected", "broker", broker, "session_present", present)
	return cli, nil
}

// onMessage runs on Paho's router goroutine, one message at a time in
// arrival order (OrderMatters). Blocking in the handler is the
// backpressure: Paho stops reading the connection meanwhile.
func (s *Session) onMessage(m paho.Message, acks *acker) {
	if s.draining.Load() || !s.valid() {
		return // left unacknowledged for the next owner
	}
	var ack func()
	if m.Qos() > 0 {
		ack = acks.add(m)
	} else {
		ack = func() {}
	}
	if !transport.Wanted(s.cfg.Subscriptions, m.Topic()) {
		s.unmatched.Add(1)
		s.mu.Lock()
		inGrace := s.activatedAt.IsZero() || time.Since(s.activatedAt) < s.cfg.UnmatchedGrace
		s.mu.Unlock()
		if !inGrace {
			s.log.Warn("message matches no configured filter; acknowledged and dropped", "topic", m.Topic())
		}
		ack()
		return
	}
	s.cfg.Handler(&transport.Message{Topic: m.Topic(), Payload: m.Payload(), QoS: m.Qos(), Retain: m.Retained(), Received: time.Now()}, ack)
}

// activated records when the latest activation completed.
func (s *Session) activated(at time.Time) {
	s.mu.Lock()
	s.activatedAt = at
	s.mu.Unlock()
}

// acker sends the acknowledgments of one connection in the order the
// messages arrived (MQTT 3.1.1 section 4.6), whatever order the handler
// releases them in: a released acknowledgment waits for the earlier ones.
// Paho's Message.Ack sends at once, so the order is kept here. The tenure
// is checked before each acknowledgment: once it ended, nothing more is
// acknowledged and the broker redelivers to the successor.
type acker struct {
	valid func() bool

	send sync.Mutex // held while the released prefix is sent, so senders keep the order
	mu   sync.Mutex
	q    []*pending
}

type pending struct {
	m        paho.Message
	released bool
}

// add queues m (in arrival order) and returns its release function, which
// may be called from any goroutine, once.
func (a *acker) add(m paho.Message) func() {
	p := &pending{m: m}
	a.mu.Lock()
	a.q = append(a.q, p)
	a.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { a.release(p) }) }
}

func (a *acker) release(p *pending) {
	a.send.Lock()
	defer a.send.Unlock()
	a.mu.Lock()
	p.released = true
	n := 0
	for n < len(a.q) && a.q[n].released {
		n++
	}
	ready := slices.Clone(a.q[:n])
	clear(a.q[:n])
	a.q = a.q[n:]
	a.mu.Unlock()
	for _, r := range ready {
		if !a.valid() {
			return
		}
		r.m.Ack()
	}
}

// state is the session's subscription state file.
func (s *Session) state() transport.SubscriptionState {
	return transport.SubscriptionState{File: s.cfg.StateFile, ClientID: s.cfg.ClientID, Log: s.log}
}
