// Package mqtt is the bridge's MQTT sender. It publishes at QoS 1 (or 0 or
// 2: a QoS 2 message counts accepted at its PUBCOMP) to another broker
// with a pipeline: PUBLISH packets are written in the order they were
// sent, as many as the broker's receive maximum allows in flight, by
// whichever goroutine holds the write lock — at a modest rate the one
// calling Send, when nobody else writes (so a message costs no hand-over
// to another goroutine); at high rates, and when acknowledgments open the
// window again, the session's goroutine — and a reader matches the
// PUBACKs. A message counts accepted when its PUBACK arrives with a
// success reason code. Publishing each message on its own goroutine (or
// waiting for each PUBACK before the next PUBLISH) would reorder or
// serialize the stream; this keeps per-topic order at full pipeline depth.
// The hot packets are encoded and decoded by package mqttconn, the rest by
// paho.golang's codec.
//
// When the connection is lost or cannot be established, every
// unacknowledged or queued message fails (the route retries it, then
// dead-letters it), and the sender reconnects with backoff. A PUBACK that
// refuses the message itself (see PermanentReason) is a permanent failure:
// the route dead-letters the message without retrying it.
package mqtt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/packets"

	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/mqttconn"
	"github.com/myriarch/myriarch/internal/bridge/sender"
)

// Config configures the sender (MaxInFlight is not used: the broker's
// receive maximum bounds what is in flight).
type Config = sender.MQTTConfig

type item struct {
	m    *sender.Message
	done func(error)
	sent time.Time
	seq  uint64
}

// Sender publishes to one broker.
type Sender struct {
	cfg Config
	log *slog.Logger

	// wmu is held by whoever writes PUBLISH packets: the goroutine that
	// calls Send, when nobody else is writing (no goroutine hand-over per
	// message), or the session's goroutine when the window opens again.
	wmu      sync.Mutex
	w        writer
	lastSend atomic.Int64 // nanotime of the latest Send

	mu      sync.Mutex
	queue   []item
	pending map[uint16]item
	closed  bool
	kick    chan struct{}
	acked   chan struct{} // a PUBACK freed a slot

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// ErrConnectionLost fails the messages in flight when the connection drops.
var ErrConnectionLost = errors.New("mqtt sender: connection lost before PUBACK")

// New starts the sender; it connects in the background and Close stops it.
func New(cfg Config) *Sender {
	cfg = cfg.WithDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Sender{cfg: cfg, log: cfg.Logger.With("sender", "mqtt", "broker", cfg.Broker), pending: map[uint16]item{},
		kick: make(chan struct{}, 1), acked: make(chan struct{}, 1), ctx: ctx, cancel: cancel, done: make(chan struct{})}
	go s.run()
	return s
}

// inlineGap is the time since the previous Send beyond which Send writes
// itself (see Send): at 5,000 msg/s messages come 200µs apart, at full
// speed a few µs apart, and there one write per message would cost more
// than the hand-over that lets the session's goroutine write them in
// batches.
const inlineGap = 50 * time.Microsecond

var clockBase = time.Now()

// nanotime is a monotonic clock in nanoseconds.
func nanotime() int64 { return int64(time.Since(clockBase)) }

// Send queues m for publishing.
func (s *Sender) Send(m *sender.Message, done func(error)) {
	if !sender.Enqueue(&s.mu, &s.closed, &s.queue, item{m: m, done: done}, done) {
		return
	}
	now := nanotime()
	light := now-s.lastSend.Swap(now) > int64(inlineGap)
	// At a modest rate write it now, unless another goroutine is writing
	// (that one takes it with the rest of the queue): no hand-over to the
	// session's goroutine, which costs a wake-up per message. At high
	// rates the session's goroutine writes, so that reading from the source
	// broker and writing to this one run in parallel, in larger batches.
	if light && s.wmu.TryLock() {
		connected := s.w.conn != nil
		_ = s.writeQueued() // a failed write ends the session through its reader
		s.wmu.Unlock()
		if connected {
			return
		}
	}
	sender.Wake(s.kick)
}

func (s *Sender) run() {
	defer close(s.done)
	sender.Reconnect(s.ctx, s.log, s.session, func(err error) {
		s.failPending(ErrConnectionLost)
		// What queued while the connection was failing fails too.
		s.mu.Lock()
		q := s.queue
		s.queue = nil
		s.mu.Unlock()
		for _, it := range q {
			if it.m.Withdrawn() {
				it.done(sender.ErrWithdrawn)
				continue
			}
			it.done(fmt.Errorf("mqtt sender: not connected: %w", err))
		}
	})
	s.mu.Lock()
	q := s.queue
	s.queue, s.closed = nil, true
	s.mu.Unlock()
	for _, it := range q {
		it.done(sender.ErrClosed)
	}
}

func (s *Sender) failPending(err error) {
	s.mu.Lock()
	p := s.pending
	s.pending = map[uint16]item{}
	s.mu.Unlock()
	// Fail in send order so that retries keep it as far as they can.
	ids := make([]item, 0, len(p))
	for _, it := range p {
		ids = append(ids, it)
	}
	for _, it := range sortBySeq(ids) {
		it.done(err)
	}
}

// session runs one connection until it fails or the sender closes.
func (s *Sender) session() error {
	cctx, cancel := context.WithTimeout(s.ctx, s.cfg.ConnectTimeout)
	conn, recvMax, err := s.connect(cctx)
	cancel()
	if err != nil {
		return err
	}
	defer conn.Close()
	s.log.Info("mqtt sender connected", "receive_maximum", recvMax)

	readErr := make(chan error, 1)
	var rwg sync.WaitGroup
	rwg.Add(1)
	lastRead := newStamp()
	go func() {
		defer rwg.Done()
		readErr <- s.read(conn, lastRead)
	}()
	defer rwg.Wait()
	defer conn.Close() // wakes the reader

	s.wmu.Lock()
	s.w = writer{conn: conn, recvMax: recvMax, lastWrite: time.Now()}
	s.wmu.Unlock()
	defer func() {
		// After this no Send writes to conn: what is pending now fails
		// with the connection (run's failPending).
		s.wmu.Lock()
		s.w = writer{}
		s.wmu.Unlock()
	}()
	keepAlive := s.cfg.KeepAlive
	tick := time.NewTicker(max(100*time.Millisecond, min(time.Second, s.cfg.Timeout/4)))
	defer tick.Stop()
	pingSent := time.Time{}
	for {
		select {
		case <-s.ctx.Done():
			_, _ = packets.NewControlPacket(packets.DISCONNECT).WriteTo(conn)
			return s.ctx.Err()
		case err := <-readErr:
			return err
		case <-tick.C:
			now := time.Now()
			s.wmu.Lock()
			lastWrite := s.w.lastWrite
			if keepAlive > 0 && now.Sub(lastWrite) >= keepAlive/2 && pingSent.IsZero() {
				s.w.lastWrite = now
				s.wmu.Unlock()
				if _, err := packets.NewControlPacket(packets.PINGREQ).WriteTo(conn); err != nil {
					return err
				}
				pingSent = now
			} else {
				s.wmu.Unlock()
			}
			if !pingSent.IsZero() && lastRead.get().After(pingSent) {
				pingSent = time.Time{}
			}
			if !pingSent.IsZero() && now.Sub(pingSent) > max(keepAlive, time.Second) {
				return errors.New("no PINGRESP within keep_alive")
			}
			if oldest := s.oldestPending(); !oldest.IsZero() && now.Sub(oldest) > s.cfg.Timeout {
				return fmt.Errorf("no PUBACK within %v", s.cfg.Timeout)
			}
			continue
		case <-s.kick:
		case <-s.acked:
		}
		s.wmu.Lock()
		err := s.writeQueued()
		s.wmu.Unlock()
		if err != nil {
			return err
		}
	}
}

// writer is the state of writing PUBLISH packets on the current
// connection, under Sender.wmu: whoever holds wmu writes.
type writer struct {
	conn      *mqttconn.Conn // nil: not connected
	recvMax   uint16
	lastWrite time.Time
	nextID    uint16
	seq       uint64
	stamps    stampCache
	// Reused from batch to batch.
	batch, withdrawn, written []item
	ids                       []uint16
	out                       []byte
}

// writeQueued writes what is queued, as far as the window allows, with
// s.wmu held: the batch's PUBLISH packets are encoded into one buffer and
// leave in one write. A write error closes the connection (the reader
// then ends the session) and is returned.
func (s *Sender) writeQueued() error {
	w := &s.w
	if w.conn == nil {
		return nil
	}
	for {
		s.mu.Lock()
		room := int(w.recvMax) - len(s.pending)
		if room <= 0 || len(s.queue) == 0 {
			s.mu.Unlock()
			return nil
		}
		n := min(room, len(s.queue))
		batch, withdrawn := w.batch[:0], w.withdrawn[:0]
		var check sender.TenureCheck
		for _, it := range s.queue[:n] {
			// A withdrawn message waits for an earlier one of its topic
			// that failed, or its tenure ended; it is not written.
			if check.Withdrawn(it.m) {
				withdrawn = append(withdrawn, it)
				continue
			}
			batch = append(batch, it)
		}
		clear(s.queue[:n])
		if n == len(s.queue) {
			s.queue = s.queue[:0] // reused: Send appends without allocating
		} else {
			s.queue = s.queue[n:]
		}
		now := time.Now()
		ids := w.ids[:0]
		for i := range batch {
			if s.cfg.QoS == 0 {
				ids = append(ids, 0)
				continue
			}
			for {
				w.nextID++
				if w.nextID == 0 {
					w.nextID = 1
				}
				if _, used := s.pending[w.nextID]; !used {
					break
				}
			}
			ids = append(ids, w.nextID)
			w.seq++
			batch[i].sent, batch[i].seq = now, w.seq
			s.pending[w.nextID] = batch[i]
		}
		s.mu.Unlock()
		for i, it := range withdrawn {
			it.done(sender.ErrWithdrawn)
			withdrawn[i] = item{}
		}
		out := w.out[:0]
		written := w.written[:0] // QoS 0: accepted once written
		for i, it := range batch {
			props, expired := publishProperties(it.m, now, &w.stamps)
			if expired {
				// MQTT 5: a message whose expiry passed is not forwarded;
				// it counts as delivered (nobody may receive it any more).
				s.mu.Lock()
				delete(s.pending, ids[i])
				s.mu.Unlock()
				it.done(nil)
				continue
			}
			out = mqttconn.AppendPublish(out, it.m.Topic, ids[i], s.cfg.QoS, it.m.Retain, false, props, it.m.Payload)
			if s.cfg.QoS == 0 {
				written = append(written, it)
			}
		}
		clear(batch)
		var err error
		if len(out) > 0 {
			err = w.conn.WritePacket(out)
			w.lastWrite = now
		}
		// Unwritten QoS 0 messages fail now; QoS 1 and 2 ones fail with
		// the connection.
		for i, it := range written {
			it.done(err)
			written[i] = item{}
		}
		if cap(out) > 1<<20 {
			out = nil // do not keep a buffer that one large batch grew
		}
		w.batch, w.withdrawn, w.written, w.ids, w.out = batch, withdrawn, written[:0], ids, out
		if err != nil {
			return err
		}
	}
}

// stampCache encodes the MQTT 5 user properties that carry an exclusive
// session's fencing stamp (package fence), once per stamp: a tenure's
// messages share one.
type stampCache struct {
	stamp fence.Stamp
	props []byte
}

// properties returns the encoded properties for f; nil for a
// non-exclusive session's message.
func (c *stampCache) properties(f fence.Stamp) []byte {
	if f.IsZero() {
		return nil
	}
	if c.props == nil || f != c.stamp {
		c.stamp = f
		pp := &packets.Properties{User: []packets.User{{Key: fence.MQTTLeaseVersion, Value: f.Version()}, {Key: fence.MQTTSessionID, Value: f.SessionID}}}
		c.props = pp.Pack(packets.PUBLISH)
	}
	return c.props
}

// publishProperties are the encoded PUBLISH properties of m at now: its
// MQTT 5 properties carried through, the message expiry decremented by the
// time since the bridge received m (expired reports that none is left),
// and an exclusive session's fencing stamp as user properties (package
// fence), which replaces a stamp the message arrived with. nil when there
// are none; a message with only a stamp shares stamps' cached encoding
// (the common case of an exclusive session costs no allocation).
func publishProperties(m *sender.Message, now time.Time, stamps *stampCache) (props []byte, expired bool) {
	mp := m.Properties
	if mp == nil {
		return stamps.properties(m.Fence), false
	}
	pp := &packets.Properties{}
	pp.ContentType, pp.PayloadFormat = mp.ContentType, mp.PayloadFormat
	pp.ResponseTopic, pp.CorrelationData = mp.ResponseTopic, mp.CorrelationData
	if mp.MessageExpiry != nil {
		held := uint32(0)
		if !m.Received.IsZero() && now.After(m.Received) {
			held = uint32(now.Sub(m.Received) / time.Second)
		}
		if held >= *mp.MessageExpiry {
			return nil, true
		}
		left := *mp.MessageExpiry - held
		pp.MessageExpiry = &left
	}
	for _, u := range mp.User {
		if !m.Fence.IsZero() && (u.Key == fence.MQTTLeaseVersion || u.Key == fence.MQTTSessionID) {
			continue
		}
		pp.User = append(pp.User, packets.User{Key: u.Key, Value: u.Value})
	}
	if !m.Fence.IsZero() {
		pp.User = append(pp.User, packets.User{Key: fence.MQTTLeaseVersion, Value: m.Fence.Version()}, packets.User{Key: fence.MQTTSessionID, Value: m.Fence.SessionID})
	}
	return pp.Pack(packets.PUBLISH), false
}

func (s *Sender) oldestPending() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var oldest time.Time
	for _, it := range s.pending {
		if oldest.IsZero() || it.sent.Before(oldest) {
			oldest = it.sent
		}
	}
	return oldest
}

func (s *Sender) connect(ctx context.Context) (*mqttconn.Conn, uint16, error) {
	conn, err := mqttconn.Dial(ctx, s.cfg.Broker, s.cfg.TLS)
	if err != nil {
		return nil, 0, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetReadDeadline(dl)
	}
	cp := &packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: s.cfg.ClientID, CleanStart: true,
		KeepAlive: uint16(s.cfg.KeepAlive / time.Second), Properties: &packets.Properties{}}
	if s.cfg.Username != "" {
		cp.UsernameFlag, cp.Username = true, s.cfg.Username
	}
	if len(s.cfg.Password) > 0 {
		cp.PasswordFlag, cp.Password = true, s.cfg.Password
	}
	pkt := packets.NewControlPacket(packets.CONNECT)
	pkt.Content = cp
	if _, err := pkt.WriteTo(conn); err != nil {
		conn.Close()
		return nil, 0, err
	}
	recv, err := packets.ReadPacket(conn)
	if err != nil {
		conn.Close()
		return nil, 0, fmt.Errorf("waiting for CONNACK: %w", err)
	}
	ca, ok := recv.Content.(*packets.Connack)
	if !ok {
		conn.Close()
		return nil, 0, fmt.Errorf("expected CONNACK, got %s", recv.PacketType())
	}
	if ca.ReasonCode >= 0x80 {
		conn.Close()
		return nil, 0, fmt.Errorf("broker refused the connection: %s", ca.Reason())
	}
	_ = conn.SetReadDeadline(time.Time{})
	recvMax := uint16(65535)
	if ca.Properties != nil && ca.Properties.ReceiveMaximum != nil {
		recvMax = *ca.Properties.ReceiveMaximum
	}
	return conn, recvMax, nil
}

func (s *Sender) read(conn *mqttconn.Conn, last *stamp) error {
	var out []byte
	for {
		hdr, body, err := conn.ReadPacket()
		if err != nil {
			return err
		}
		last.set(time.Now())
		switch hdr >> 4 {
		case packets.PUBACK:
			if err := s.complete(body, func(code byte) error {
				return refused((&packets.Puback{ReasonCode: code}).Reason(), code)
			}); err != nil {
				return err
			}
		case packets.PUBREC:
			// QoS 2, first half: the broker has the message. A refusal
			// ends the exchange; otherwise release it with PUBREL and
			// wait for PUBCOMP (the message keeps its slot until then).
			id, code, err := mqttconn.DecodeAck(body)
			if err != nil {
				return err
			}
			s.mu.Lock()
			it, ok := s.pending[id]
			if ok && code >= 0x80 {
				delete(s.pending, id)
			}
			s.mu.Unlock()
			if !ok {
				continue
			}
			if code >= 0x80 {
				s.signalRoom()
				it.done(refused((&packets.Pubrec{ReasonCode: code}).Reason(), code))
				continue
			}
			out = mqttconn.AppendAck(out[:0], packets.PUBREL, id, 0)
			if err := conn.WritePacket(out); err != nil {
				return err
			}
		case packets.PUBCOMP:
			if err := s.complete(body, func(code byte) error {
				// Packet identifier not found: the broker lost the
				// exchange; publishing again is the way to deliver.
				return fmt.Errorf("broker ended the QoS 2 exchange: %s", (&packets.Pubcomp{ReasonCode: code}).Reason())
			}); err != nil {
				return err
			}
		case packets.DISCONNECT:
			cp, err := mqttconn.Parse(hdr, body)
			if err != nil {
				return fmt.Errorf("broker sent DISCONNECT: %w", err)
			}
			return fmt.Errorf("broker sent DISCONNECT: %s", cp.Content.(*packets.Disconnect).Reason())
		}
	}
}

// complete settles the message that an acknowledgment (PUBACK, PUBCOMP)
// in body ends: it succeeds, or fails with refusal(code) for a reason code
// of 0x80 or more. An acknowledgment of nothing pending is ignored.
func (s *Sender) complete(body []byte, refusal func(code byte) error) error {
	id, code, err := mqttconn.DecodeAck(body)
	if err != nil {
		return err
	}
	it, ok := s.settle(id)
	if !ok {
		return nil
	}
	if code >= 0x80 {
		it.done(refusal(code))
	} else {
		it.done(nil)
	}
	return nil
}

// settle removes message id from the pending ones and frees its slot in
// the window.
func (s *Sender) settle(id uint16) (item, bool) {
	s.mu.Lock()
	it, ok := s.pending[id]
	delete(s.pending, id)
	waiting := len(s.queue) > 0
	s.mu.Unlock()
	if waiting {
		sender.Wake(s.acked)
	}
	return it, ok
}

// signalRoom wakes the session's goroutine for messages that wait for
// room in the window; when none waits, it is not woken (a wake-up per
// message costs more CPU than the rest of the sender's work).
func (s *Sender) signalRoom() {
	s.mu.Lock()
	waiting := len(s.queue) > 0
	s.mu.Unlock()
	if waiting {
		sender.Wake(s.acked)
	}
}

// refused is the error of a message that the broker refused with reason
// code: permanent when PermanentReason says so.
func refused(reason string, code byte) error {
	err := fmt.Errorf("broker refused the message: %s", reason)
	if PermanentReason(code) {
		return sender.Permanent(err)
	}
	return err
}

// PermanentReason reports whether a PUBACK reason code refuses the message
// itself, so that publishing it again cannot succeed: not authorized
// (0x87), topic name invalid (0x90), payload format invalid (0x99). Others
// (unspecified 0x80, implementation specific 0x83, quota exceeded 0x97,
// packet identifier in use 0x91) are retried.
func PermanentReason(code byte) bool {
	switch code {
	case packets.PubackNotAuthorized, packets.PubackTopicNameInvalid, packets.PubackPayloadFormatInvalid:
		return true
	}
	return false
}

// Close stops the sender within ctx: unacknowledged messages fail.
func (s *Sender) Close(ctx context.Context) error {
	return sender.Close(ctx, &s.mu, &s.closed, s.cancel, s.done)
}
