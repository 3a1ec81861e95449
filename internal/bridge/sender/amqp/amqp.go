// Package amqp is the bridge's AMQP 0.9.1 sender (RabbitMQ), on
// rabbitmq/amqp091-go. It publishes every message persistent (delivery
// mode 2) to one exchange, with a routing key rendered from the MQTT topic
// (see package routingkey), on one channel in publisher-confirm mode, and counts a
// message accepted when the broker confirmed it (basic.ack). A nack, a
// mandatory message the broker returned as unroutable, a confirm that does
// not come within the timeout, and a channel or connection that closes
// before the confirm all fail the message: the route retries it (or
// dead-letters it), so the source is acknowledged only for what the broker
// took responsibility for.
//
// One goroutine owns the connection: it dials, publishes what was queued,
// collects confirms and returns, and after a lost connection dials again
// with a backoff that doubles from 100ms to 5s. While it has no
// connection, what is sent fails at once (the route's retry backs off)
// instead of waiting without bound.
//
// Headers: mqtt_topic (the topic the message arrived on), mqtt_received
// (RFC 3339 UTC) and the fencing stamp (Myriarch-Lease-Version,
// Myriarch-Session-Id, see package fence). The message id is unique per
// publish (a retry gets a new one): the sender uses it to match a returned
// message to its confirm.
package amqp

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	amqpgo "github.com/rabbitmq/amqp091-go"

	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/sender/amqp/routingkey"
)

// Config configures the sender.
type Config struct {
	// URL is amqp://host:port/vhost or amqps://...; credentials in it are
	// replaced by Username/Password when Username is set.
	URL      string
	Username string
	Password string
	// TLS configures amqps:// (nil: the system roots and the URL's host).
	TLS *tls.Config
	// Exchange is the exchange published to; "" is the default exchange,
	// which routes by queue name.
	Exchange string
	// RoutingKey renders each message's routing key (routingkey.Default when
	// zero).
	RoutingKey routingkey.Template
	// Mandatory asks the broker to return a message no queue takes; a
	// returned message is not accepted.
	Mandatory bool
	// Timeout bounds the connect and the wait for each confirm.
	Timeout time.Duration
	// Name is the connection name shown in the broker's management.
	Name   string
	Logger *slog.Logger
}

// DefaultTimeout bounds the connect and each confirm when Config.Timeout
// is not positive.
const DefaultTimeout = 10 * time.Second

// maxUnconfirmed bounds the messages published and not yet confirmed; the
// confirm channel holds as many, so the library's reader never blocks on
// it while this sender publishes.
const maxUnconfirmed = 1 << 14

// Errors a message fails with.
var (
	ErrNotConnected = errors.New("amqp: not connected to the broker")
	ErrNacked       = errors.New("amqp: the broker nacked the message")
	ErrNoConfirm    = errors.New("amqp: no publisher confirm within the timeout")
)

type item struct {
	m    *sender.Message
	done func(error)
}

type pending struct {
	item
	tag      uint64
	deadline time.Time
	returned string // the reason the broker returned it ("" none)
}

// Sender publishes to an AMQP 0.9.1 broker.
type Sender struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	queue  []item
	closed bool
	kick   chan struct{}
	ctx    context.Context // ends when Close gives up
	cancel context.CancelFunc
	exited chan struct{}
}

// New starts the sender; it connects in the background, so a broker that
// is down at start delays delivery, not the bridge.
func New(cfg Config) *Sender {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.RoutingKey.IsZero() {
		cfg.RoutingKey = routingkey.MustParse(routingkey.Default)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Sender{cfg: cfg, log: cfg.Logger, kick: make(chan struct{}, 1), exited: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	go s.run()
	return s
}

// Send queues m for the connection's goroutine.
func (s *Sender) Send(m *sender.Message, done func(error)) {
	if !sender.Enqueue(&s.mu, &s.closed, &s.queue, item{m, done}, done) {
		return
	}
	sender.Wake(s.kick)
}

// take removes up to n queued items.
func (s *Sender) take(n int) (q []item, closing bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n = min(n, len(s.queue))
	q = append([]item(nil), s.queue[:n]...)
	s.queue = s.queue[n:]
	if len(s.queue) == 0 {
		s.queue = nil
	}
	return q, s.closed
}

// failQueued fails everything queued with err.
func (s *Sender) failQueued(err error) {
	q, _ := s.take(1 << 30)
	for _, it := range q {
		it.done(err)
	}
}

func (s *Sender) closing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Sender) run() {
	defer close(s.exited)
	backoff := 100 * time.Millisecond
	for s.ctx.Err() == nil {
		connected, err := s.session()
		if err == nil || s.ctx.Err() != nil {
			break // closed and drained, or Close gave up
		}
		if connected {
			backoff = 100 * time.Millisecond
		}
		// What waited for the connection fails now, so that the route's
		// retry and dead-letter policy applies while the broker is away.
		s.failQueued(fmt.Errorf("%w: %v", ErrNotConnected, err))
		if s.closing() {
			break
		}
		s.log.Warn("amqp sender: connection lost; reconnecting", "err", err, "backoff", backoff)
		select {
		case <-s.ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	s.failQueued(sender.ErrClosed)
}

// dialURL is the URL with Username/Password put in.
func (s *Sender) dialURL() (string, error) {
	if s.cfg.Username == "" {
		return s.cfg.URL, nil
	}
	u, err := url.Parse(s.cfg.URL)
	if err != nil {
		return "", err
	}
	u.User = url.UserPassword(s.cfg.Username, s.cfg.Password)
	return u.String(), nil
}

// session runs one connection. It returns nil when the sender is closed
// and nothing is left to confirm, else why the connection ended; connected
// reports whether the connection was up.
func (s *Sender) session() (connected bool, err error) {
	addr, err := s.dialURL()
	if err != nil {
		return false, err
	}
	conn, err := amqpgo.DialConfig(addr, amqpgo.Config{
		Dial:            amqpgo.DefaultDial(s.cfg.Timeout),
		TLSClientConfig: s.cfg.TLS,
		Properties:      amqpgo.Table{"connection_name": s.cfg.Name, "product": "myriarch-bridge"},
	})
	if err != nil {
		return false, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false, err
	}
	if s.cfg.Exchange != "" {
		// Only checks that the exchange exists: the topology is the
		// operator's. A missing one is a clear error here instead of a
		// channel closed by the first publish.
		if err := ch.ExchangeDeclarePassive(s.cfg.Exchange, "topic", true, false, false, false, nil); err != nil {
			return false, fmt.Errorf("exchange %q: %w", s.cfg.Exchange, err)
		}
	}
	if err := ch.Confirm(false); err != nil {
		return false, err
	}
	confirms := ch.NotifyPublish(make(chan amqpgo.Confirmation, maxUnconfirmed))
	// Unbuffered: the library hands a return over before it reads the
	// frames after it, so the return of a message is recorded before its
	// ack is taken from confirms (both on this goroutine).
	returns := ch.NotifyReturn(make(chan amqpgo.Return))
	connClosed := conn.NotifyClose(make(chan *amqpgo.Error, 1))
	chClosed := ch.NotifyClose(make(chan *amqpgo.Error, 1))
	nonce := newNonce()

	var inflight []*pending // in publish order
	byTag := map[uint64]*pending{}
	fail := func(err error) {
		for _, p := range inflight {
			if p.done != nil {
				p.done(err)
			}
		}
		inflight = nil
	}
	defer func() {
		if err != nil {
			fail(err)
		} else {
			fail(sender.ErrClosed)
		}
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		// Settle the head of inflight: confirms may come out of order
		// relative to the list (multiple acks), done runs in the order
		// they were confirmed, but the list is trimmed from the front.
		for len(inflight) > 0 && inflight[0].done == nil {
			inflight = inflight[1:]
		}
		if len(inflight) == 0 {
			inflight = nil
		}
		// Publish what is queued, up to the confirm window.
		if room := maxUnconfirmed - len(byTag); room > 0 {
			q, closing := s.take(room)
			if closing && len(q) == 0 && len(byTag) == 0 {
				return true, nil
			}
			var check sender.TenureCheck // one batch, one point of action
			for i, it := range q {
				if check.Withdrawn(it.m) {
					it.done(sender.ErrWithdrawn)
					continue
				}
				p, perr := s.publish(ch, nonce, it)
				if perr != nil {
					if sender.IsPermanent(perr) {
						it.done(perr)
						continue
					}
					// The channel is unusable: this one and the rest fail.
					it.done(perr)
					for _, rest := range q[i+1:] {
						rest.done(perr)
					}
					return true, perr
				}
				inflight = append(inflight, p)
				byTag[p.tag] = p
			}
		}
		if len(inflight) > 0 {
			resetTimer(timer, time.Until(inflight[0].deadline))
		} else {
			resetTimer(timer, time.Hour)
		}
		select {
		case <-s.ctx.Done():
			return true, sender.ErrClosed
		case <-s.kick:
		case r, ok := <-returns:
			if !ok {
				return true, closeReason(chClosed, connClosed)
			}
			if tag, ok := tagOf(r.MessageId, nonce); ok {
				if p := byTag[tag]; p != nil {
					p.returned = fmt.Sprintf("%d %s", r.ReplyCode, r.ReplyText)
				}
			}
		case c, ok := <-confirms:
			if !ok {
				return true, closeReason(chClosed, connClosed)
			}
			p := byTag[c.DeliveryTag]
			if p == nil {
				continue
			}
			delete(byTag, c.DeliveryTag)
			done := p.done
			p.done = nil
			switch {
			case !c.Ack:
				done(ErrNacked)
			case p.returned != "":
				done(fmt.Errorf("amqp: the broker returned the message as unroutable (exchange %q, routing key %q): %s",
					s.cfg.Exchange, s.cfg.RoutingKey.Key(p.m.Topic), p.returned))
			default:
				done(nil)
			}
		case e := <-chClosed:
			return true, closedErr(e)
		case e := <-connClosed:
			return true, closedErr(e)
		case <-timer.C:
			if len(inflight) > 0 && !time.Now().Before(inflight[0].deadline) {
				// A confirm overdue: the connection is in doubt. Closing it
				// fails everything unconfirmed, in order, so the retries
				// keep the order.
				return true, ErrNoConfirm
			}
		}
	}
}

// publish publishes one message and returns it as pending.
func (s *Sender) publish(ch *amqpgo.Channel, nonce string, it item) (*pending, error) {
	m := it.m
	key := s.cfg.RoutingKey.Key(m.Topic)
	if len(key) > routingkey.Max {
		return nil, sender.Permanent(fmt.Errorf("amqp: routing key %q is %d bytes long, above AMQP's %d", truncate(key), len(key), routingkey.Max))
	}
	h := amqpgo.Table{"mqtt_topic": m.SourceTopic}
	if !m.Received.IsZero() {
		h["mqtt_received"] = m.Received.UTC().Format(time.RFC3339Nano)
	}
	if f := m.Fence; !f.IsZero() {
		h[fence.HeaderLeaseVersion] = f.Version()
		h[fence.HeaderSessionID] = f.SessionID
	}
	pub := amqpgo.Publishing{
		Headers:      h,
		DeliveryMode: amqpgo.Persistent,
		Timestamp:    time.Now(),
		Body:         m.Payload,
	}
	if m.Properties != nil {
		pub.ContentType = m.Properties.ContentType
		pub.CorrelationId = string(m.Properties.CorrelationData)
	}
	tag := ch.GetNextPublishSeqNo()
	pub.MessageId = nonce + "-" + strconv.FormatUint(tag, 10)
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.Timeout)
	defer cancel()
	if err := ch.PublishWithContext(ctx, s.cfg.Exchange, key, s.cfg.Mandatory, false, pub); err != nil {
		return nil, err
	}
	return &pending{item: it, tag: tag, deadline: time.Now().Add(s.cfg.Timeout)}, nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

func newNonce() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// tagOf reads the delivery tag back from a message id this sender set.
func tagOf(id, nonce string) (uint64, bool) {
	rest, ok := strings.CutPrefix(id, nonce+"-")
	if !ok {
		return 0, false
	}
	t, err := strconv.ParseUint(rest, 10, 64)
	return t, err == nil
}

func resetTimer(t *time.Timer, d time.Duration) {
	t.Stop()
	select {
	case <-t.C:
	default:
	}
	t.Reset(max(d, time.Millisecond))
}

func closedErr(e *amqpgo.Error) error {
	if e == nil {
		return errors.New("amqp: connection closed")
	}
	return fmt.Errorf("amqp: closed by the broker: %w", e)
}

// closeReason is the error that closed the channel, once the library has
// reported it (it closes the notify channels right after).
func closeReason(ch, conn chan *amqpgo.Error) error {
	select {
	case e := <-ch:
		return closedErr(e)
	case e := <-conn:
		return closedErr(e)
	default:
		return errors.New("amqp: channel closed")
	}
}

// Close stops intake, lets what is queued be published and confirmed
// within ctx, then closes the connection; what is left fails with
// sender.ErrClosed.
func (s *Sender) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	sender.Wake(s.kick)
	select {
	case <-s.exited:
		s.cancel()
		return nil
	case <-ctx.Done():
		s.cancel()
		<-s.exited
		return ctx.Err()
	}
}
