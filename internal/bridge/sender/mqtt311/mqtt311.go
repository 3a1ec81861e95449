// Package mqtt311 is the bridge's MQTT 3.1.1 sender, on Eclipse Paho's
// paho.mqtt.golang client. It publishes at QoS 0, 1 or 2 from one
// goroutine, so Paho writes the PUBLISH packets in the order they were
// sent, with up to MaxInFlight of them unacknowledged; another goroutine
// completes them in the same order: a QoS 1 message counts accepted at its
// PUBACK, a QoS 2 message at its PUBCOMP, a QoS 0 message once written.
//
// When the connection is lost, a PUBACK is late (Timeout) or the
// connection cannot be established, every unacknowledged or queued message
// fails (the route retries it, then dead-letters it), and the sender
// reconnects with backoff and a fresh client; Paho's own reconnect is off,
// so that nothing is published behind the route's back. Connections start
// clean (CleanSession true), like the MQTT 5 sender's.
//
// MQTT 3.1.1 has no properties and no reason codes: a message's MQTT 5
// properties (user properties, content type, payload format, response
// topic, correlation data) and an exclusive session's fencing stamp are not
// carried; a message whose expiry interval passed in the bridge is not
// published (it counts as delivered, as MQTT 5 asks of a forwarding
// server), but the remaining interval is not carried either. A broker that
// refuses a 3.1.1 PUBLISH (an ACL) acknowledges it or drops the connection;
// nothing is a permanent failure.
package mqtt311

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/myriarch/myriarch/internal/bridge/paho311"
	"github.com/myriarch/myriarch/internal/bridge/sender"
)

// Config configures the sender.
type Config = sender.MQTTConfig

// DefaultMaxInFlight is the default of Config.MaxInFlight.
const DefaultMaxInFlight = 1000

// ErrConnectionLost fails the messages in flight when the connection drops.
var ErrConnectionLost = errors.New("mqtt 3.1.1 sender: connection lost before the acknowledgment")

type item struct {
	m    *sender.Message
	done func(error)
}

// Sender publishes to one broker over MQTT 3.1.1.
type Sender struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	queue  []item
	closed bool
	kick   chan struct{}

	warnedProps atomic.Bool

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// New starts the sender; it connects in the background and Close stops it.
func New(cfg Config) *Sender {
	cfg = cfg.WithDefaults()
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Sender{cfg: cfg, log: cfg.Logger.With("sender", "mqtt", "protocol", "3.1.1", "broker", cfg.Broker),
		kick: make(chan struct{}, 1), ctx: ctx, cancel: cancel, done: make(chan struct{})}
	go s.run()
	return s
}

// Send queues m for publishing.
func (s *Sender) Send(m *sender.Message, done func(error)) {
	if !sender.Enqueue(&s.mu, &s.closed, &s.queue, item{m: m, done: done}, done) {
		return
	}
	sender.Wake(s.kick)
}

func (s *Sender) run() {
	defer close(s.done)
	sender.Reconnect(s.ctx, s.log, s.session, func(err error) {
		// What queued while the connection was failing fails too.
		s.failQueued(func(it item) error {
			if it.m.Withdrawn() {
				return sender.ErrWithdrawn
			}
			return fmt.Errorf("mqtt 3.1.1 sender: not connected: %w", err)
		})
	})
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.failQueued(func(item) error { return sender.ErrClosed })
}

func (s *Sender) failQueued(why func(item) error) {
	s.mu.Lock()
	q := s.queue
	s.queue = nil
	s.mu.Unlock()
	for _, it := range q {
		it.done(why(it))
	}
}

// inflight is a published message waiting for its acknowledgment.
type inflight struct {
	it   item
	tok  paho.Token
	sent time.Time
}

// session runs one connection until it fails or the sender closes.
func (s *Sender) session() error {
	cli, lost, err := s.connect()
	if err != nil {
		return err
	}
	s.log.Info("mqtt sender connected")

	// slots bounds the messages in flight; the completer finishes them in
	// publish order and frees their slots.
	slots := make(chan struct{}, s.cfg.MaxInFlight)
	pending := make(chan inflight, s.cfg.MaxInFlight)
	broken := make(chan error, 1)
	ending := make(chan struct{})
	var cwg sync.WaitGroup
	cwg.Add(1)
	go func() {
		defer cwg.Done()
		for e := range pending {
			err := s.await(e, broken, ending)
			<-slots
			e.it.done(err)
		}
	}()
	defer func() {
		// With CleanSession true, Paho completes the tokens still in
		// flight with an error once disconnected.
		cli.Disconnect(250)
		close(ending)
		close(pending)
		cwg.Wait()
	}()

	for {
		select {
		case <-s.ctx.Done():
			return s.ctx.Err()
		case err := <-lost:
			return err
		case err := <-broken:
			return err
		case <-s.kick:
		}
		for {
			s.mu.Lock()
			batch := s.queue
			s.queue = nil
			s.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			var check sender.TenureCheck
			for i, it := range batch {
				// Wait for a slot; a loss meanwhile fails this message and
				// the rest of the batch.
				var err error
				select {
				case slots <- struct{}{}:
				case <-s.ctx.Done():
					err = s.ctx.Err()
				case err = <-lost:
				case err = <-broken:
				}
				if err != nil {
					for _, rest := range batch[i:] {
						rest.done(fmt.Errorf("%w: %v", ErrConnectionLost, err))
					}
					return err
				}
				// A withdrawn message waits for an earlier one of its topic
				// that failed, or its tenure ended: it is not published.
				// The check is the point of action, right before the write.
				if check.Withdrawn(it.m) {
					<-slots
					it.done(sender.ErrWithdrawn)
					continue
				}
				if s.expired(it.m) {
					<-slots
					it.done(nil)
					continue
				}
				tok := cli.Publish(it.m.Topic, s.cfg.QoS, it.m.Retain, it.m.Payload)
				pending <- inflight{it: it, tok: tok, sent: time.Now()}
			}
		}
	}
}

// await waits for e's acknowledgment within Timeout. A late one breaks
// the connection (the broker or the path is stuck); once the session is
// ending, what has not been acknowledged fails at once.
func (s *Sender) await(e inflight, broken chan<- error, ending <-chan struct{}) error {
	t := time.NewTimer(time.Until(e.sent.Add(s.cfg.Timeout)))
	defer t.Stop()
	select {
	case <-e.tok.Done():
		return tokenErr(e.tok)
	case <-t.C:
		err := fmt.Errorf("mqtt 3.1.1 sender: no acknowledgment within %v", s.cfg.Timeout)
		select {
		case broken <- err:
		default:
		}
		return err
	case <-ending:
		select {
		case <-e.tok.Done():
			return tokenErr(e.tok)
		default:
			return ErrConnectionLost
		}
	}
}

func tokenErr(tok paho.Token) error {
	if err := tok.Error(); err != nil {
		return fmt.Errorf("%w: %v", ErrConnectionLost, err)
	}
	return nil
}

// connect dials the broker and completes CONNECT/CONNACK within
// connect_timeout with a fresh client whose own reconnect is off.
func (s *Sender) connect() (paho.Client, <-chan error, error) {
	lost := make(chan error, 1)
	opts := paho.NewClientOptions().
		SetCleanSession(true).
		SetKeepAlive(s.cfg.KeepAlive).
		// Paho's Publish waits this long to hand a packet to its writer;
		// only a connection that is being lost makes it wait, so it is kept
		// short: the loss is noticed, and the message fails, in time.
		SetWriteTimeout(min(s.cfg.Timeout, time.Second)).
		SetConnectionLostHandler(func(_ paho.Client, err error) {
			select {
			case lost <- err:
			default:
			}
		})
	cli, _, err := paho311.Connect(s.ctx, opts, paho311.Dial{Broker: s.cfg.Broker, TLS: s.cfg.TLS, Username: s.cfg.Username,
		Password: s.cfg.Password, ClientID: s.cfg.ClientID, Timeout: s.cfg.ConnectTimeout})
	if err != nil {
		return nil, nil, err
	}
	return cli, lost, nil
}

// Close stops the sender within ctx: unacknowledged messages fail.
func (s *Sender) Close(ctx context.Context) error {
	return sender.Close(ctx, &s.mu, &s.closed, s.cancel, s.done)
}

// expired reports whether m's MQTT 5 expiry interval passed while the
// bridge held it. It also logs, once, that MQTT 3.1.1 drops properties.
func (s *Sender) expired(m *sender.Message) bool {
	p := m.Properties
	if p == nil {
		return false
	}
	if (len(p.User) > 0 || p.ContentType != "" || p.PayloadFormat != nil || p.ResponseTopic != "" || p.CorrelationData != nil) &&
		s.warnedProps.CompareAndSwap(false, true) {
		s.log.Warn("MQTT 3.1.1 carries no properties: user properties, content type, payload format, response topic and correlation data are not published", "topic", m.Topic)
	}
	if p.MessageExpiry == nil || m.Received.IsZero() {
		return false
	}
	held := time.Since(m.Received)
	return held >= time.Duration(*p.MessageExpiry)*time.Second
}
