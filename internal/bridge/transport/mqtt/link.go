package mqtt

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/packets"

	"github.com/myriarch/myriarch/internal/bridge/mqttconn"
	"github.com/myriarch/myriarch/internal/bridge/transport"
)

// link is one connection of a Session after its CONNACK: the goroutine
// that reads it and hands messages on, the acknowledgments in MQTT's
// order, the requests (SUBSCRIBE, UNSUBSCRIBE) waiting for their answers,
// and the keepalive.
type link struct {
	s       *Session
	conn    *mqttconn.Conn
	dead    chan struct{} // closed when the connection is lost
	deadErr error         // why; set before dead closes
	deadSet sync.Once

	mu     sync.Mutex
	queue  []*received // QoS 1/2 messages in arrival order, not yet acknowledged
	out    []byte      // acknowledgments encoded, not yet written
	closed bool        // no acknowledgment of this link is written any more
	// Acknowledgments that follow the previous write within ackGap wait
	// up to ackDelay for more (armed): at full speed one write carries
	// many, at a modest rate each leaves at once.
	lastAck int64 // nanotime of the latest acknowledgment write
	armed   bool
	flush   *time.Timer
	nextID  uint16 // for SUBSCRIBE and UNSUBSCRIBE
	waiters map[uint16]chan *packets.ControlPacket

	// hand is held while a message is handed on; during activation
	// (holding) what arrives waits in held, so that the SUBACKs are read
	// even while the handler blocks.
	hand    sync.Mutex
	holding bool
	held    []*received

	lastRead  atomic.Int64 // unix nanoseconds
	lastWrite atomic.Int64
	busy      atomic.Bool // the reader is handling a packet, not reading

	stop       chan struct{}
	readerDone chan struct{}
	pingerDone chan struct{}
	closeOnce  sync.Once
}

// received is one message of a link with its acknowledgment state.
type received struct {
	msg   transport.Message
	l     *link
	id    uint16
	qos   byte
	acked bool // under l.mu
}

// start runs the link's reader and keepalive on conn.
func (s *Session) start(conn *mqttconn.Conn) *link {
	now := time.Now().UnixNano()
	l := &link{s: s, conn: conn, dead: make(chan struct{}), waiters: map[uint16]chan *packets.ControlPacket{},
		holding: true, stop: make(chan struct{}), readerDone: make(chan struct{}), pingerDone: make(chan struct{})}
	l.lastRead.Store(now)
	l.lastWrite.Store(now)
	l.flush = time.AfterFunc(time.Hour, l.flushAcks)
	l.flush.Stop()
	go l.read()
	go l.keepAlive()
	return l
}

// report records the first reason the connection ended.
func (l *link) report(err error) {
	l.deadSet.Do(func() {
		l.deadErr = err
		close(l.dead)
	})
}

// close ends the link: with disconnect, a DISCONNECT (reason 0, the broker
// keeps the session for its expiry) goes out first. It waits for the
// link's goroutines; the reader finishes the message it is handing on.
func (l *link) close(disconnect bool) {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		if disconnect && len(l.out) > 0 && l.s.valid() {
			_ = l.write(l.out) // released acknowledgments go before the DISCONNECT
		}
		l.out = l.out[:0]
		l.closed = true
		l.mu.Unlock()
		l.flush.Stop()
		if disconnect {
			_, _ = packets.NewControlPacket(packets.DISCONNECT).WriteTo(l.conn)
		}
		close(l.stop)
		_ = l.conn.Close() // writes what is queued, then wakes the reader
		<-l.pingerDone
		<-l.readerDone
	})
}

// release ends activation: what arrived meanwhile is handed on in order,
// then the reader hands on each message itself.
func (l *link) release() {
	l.hand.Lock()
	defer l.hand.Unlock()
	for i, r := range l.held {
		l.s.handOn(r)
		l.held[i] = nil
	}
	l.held, l.holding = nil, false
}

func (l *link) read() {
	defer close(l.readerDone)
	for {
		l.busy.Store(false)
		hdr, body, err := l.conn.ReadPacket()
		if err != nil {
			l.report(err)
			return
		}
		l.busy.Store(true)
		l.lastRead.Store(time.Now().UnixNano())
		switch hdr >> 4 {
		case packets.PUBLISH:
			err = l.publish(hdr, body)
		case packets.PUBREL:
			// QoS 2, second half: the broker released a message that we
			// acknowledged with PUBREC; complete the exchange.
			var id uint16
			if id, _, err = mqttconn.DecodeAck(body); err == nil {
				l.mu.Lock()
				if !l.closed {
					// With any acknowledgments waiting: they are
					// independent of it, and may go now too.
					l.out = mqttconn.AppendAck(l.out, packets.PUBCOMP, id, 0)
					err = l.write(l.out)
					l.out = l.out[:0]
				}
				l.mu.Unlock()
			}
		case packets.SUBACK, packets.UNSUBACK:
			var cp *packets.ControlPacket
			if cp, err = mqttconn.Parse(hdr, body); err == nil {
				l.mu.Lock()
				w := l.waiters[cp.PacketID()]
				delete(l.waiters, cp.PacketID())
				l.mu.Unlock()
				if w != nil {
					w <- cp
				}
			}
		case packets.DISCONNECT:
			reason := ""
			code := byte(0)
			if cp, perr := mqttconn.Parse(hdr, body); perr == nil {
				d := cp.Content.(*packets.Disconnect)
				code = d.ReasonCode
				if d.Properties != nil {
					reason = d.Properties.ReasonString
				}
			}
			err = fmt.Errorf("broker sent DISCONNECT (reason code %d) %s", code, reason)
		case packets.PINGRESP:
			// lastRead is the keepalive's answer.
		default:
			err = fmt.Errorf("unexpected packet type %d from the broker", hdr>>4)
		}
		if err != nil {
			l.report(err)
			return
		}
	}
}

// write queues one encoded packet, with l.mu held so that
// acknowledgments leave in the order they were decided.
func (l *link) write(b []byte) error {
	l.lastWrite.Store(time.Now().UnixNano())
	return l.conn.WritePacket(b)
}

// publish decodes a PUBLISH and hands it on (or holds it during
// activation).
func (l *link) publish(hdr byte, body []byte) error {
	p, err := mqttconn.DecodePublish(hdr, body)
	if err != nil {
		return err
	}
	r := &received{l: l, id: p.PacketID, qos: p.QoS,
		msg: transport.Message{Topic: p.Topic, Payload: p.Payload, QoS: p.QoS, Retain: p.Retain, Received: time.Now()}}
	if len(p.Properties) > 0 {
		pp, err := mqttconn.UnpackProperties(p.Properties)
		if err != nil {
			return fmt.Errorf("PUBLISH properties: %w", err)
		}
		r.msg.Properties = properties(pp)
	}
	if p.QoS > 0 {
		// The broker keeps at most the receive maximum unacknowledged
		// (CONNECT); it is not enforced here: mosquitto 2.0 sends one
		// more, and refusing would only cost a reconnect.
		l.mu.Lock()
		l.queue = append(l.queue, r)
		l.mu.Unlock()
	}
	l.hand.Lock()
	if l.holding {
		l.held = append(l.held, r)
	} else {
		l.s.handOn(r)
	}
	l.hand.Unlock()
	return nil
}

// ack is the handler's ack: it marks the message acknowledged and writes
// the acknowledgments that are now in order (PUBACK, or PUBREC for QoS
// 2). Nothing is written once the tenure ended or the link closed: the
// broker redelivers to the next connection or owner.
func (r *received) ack() {
	if r.qos == 0 {
		return
	}
	l := r.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.acked {
		return
	}
	r.acked = true
	if l.closed || !l.s.valid() {
		return
	}
	n := 0
	out := l.out
	for n < len(l.queue) && l.queue[n].acked {
		typ := byte(packets.PUBACK)
		if l.queue[n].qos == 2 {
			typ = packets.PUBREC
		}
		out = mqttconn.AppendAck(out, typ, l.queue[n].id, 0)
		n++
	}
	if n == 0 {
		return
	}
	clear(l.queue[:n])
	if n == len(l.queue) {
		l.queue = l.queue[:0]
	} else {
		l.queue = l.queue[n:]
	}
	l.out = out
	if l.armed {
		return // the armed flush takes them
	}
	now := time.Now().UnixNano()
	if now-l.lastAck < int64(ackGap) {
		l.armed = true
		l.flush.Reset(ackDelay)
		return
	}
	l.lastAck = now
	err := l.write(out)
	l.out = out[:0]
	if err != nil {
		l.report(err)
	}
}

// ackGap and ackDelay: an acknowledgment within ackGap of the previous
// write waits up to ackDelay for others to share its write. At 5,000
// msg/s (200µs apart) every acknowledgment leaves at once; at full speed
// (µs apart) one write per acknowledgment was the bridge's largest count
// of system calls. The delay only holds messages a little longer in the
// source broker's window (receive maximum), not in the path. 10µs rather
// than 50µs: messages that a paced publisher sends in small clumps then
// still leave at once, which saved the timer's wake-ups (make bench at
// 5,000 msg/s: 1.36× broker B's CPU per message against 1.44×, in three
// alternating pairs).
const (
	ackGap   = 10 * time.Microsecond
	ackDelay = 250 * time.Microsecond
)

// flushAcks writes the acknowledgments that waited (the armed timer),
// unless the link closed or the tenure ended meanwhile.
func (l *link) flushAcks() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.armed = false
	if l.closed || len(l.out) == 0 || !l.s.valid() {
		return
	}
	l.lastAck = time.Now().UnixNano()
	err := l.write(l.out)
	l.out = l.out[:0]
	if err != nil {
		l.report(err)
	}
}

// request writes the packet that build makes for a fresh packet
// identifier and waits within ctx for the answer with that identifier.
func (l *link) request(ctx context.Context, kind byte, build func(id uint16) *packets.ControlPacket) (*packets.ControlPacket, error) {
	w := make(chan *packets.ControlPacket, 1)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, errors.New("connection closed")
	}
	for {
		l.nextID++
		if l.nextID == 0 {
			l.nextID = 1
		}
		if _, used := l.waiters[l.nextID]; !used {
			break
		}
	}
	id := l.nextID
	l.waiters[id] = w
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.waiters, id)
		l.mu.Unlock()
	}()
	l.lastWrite.Store(time.Now().UnixNano())
	if _, err := build(id).WriteTo(l.conn); err != nil {
		return nil, err
	}
	select {
	case resp := <-w:
		return resp, nil
	case <-l.dead:
		return nil, l.deadErr
	case <-ctx.Done():
		return nil, fmt.Errorf("no answer to packet type %d within reconcile_timeout: %w", kind, ctx.Err())
	}
}

// keepAlive sends PINGREQ when nothing was written for half the keep
// alive, or nothing read for a whole one, and declares the connection
// lost when no answer came within the keep alive. A reader that is busy
// handing a message on (the handler blocks: backpressure) has not read
// the answer yet, which is no loss.
func (l *link) keepAlive() {
	defer close(l.pingerDone)
	ka := l.s.cfg.KeepAlive
	if ka <= 0 {
		<-l.stop
		return
	}
	t := time.NewTicker(max(ka/4, 50*time.Millisecond))
	defer t.Stop()
	var pingSent int64
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		now := time.Now().UnixNano()
		if pingSent != 0 && l.lastRead.Load() >= pingSent {
			pingSent = 0
		}
		if pingSent != 0 {
			if now-pingSent > int64(max(ka, time.Second)) && !l.busy.Load() {
				l.report(fmt.Errorf("no PINGRESP within keep_alive %v", ka))
				_ = l.conn.Close()
				return
			}
			continue
		}
		if now-l.lastWrite.Load() >= int64(ka/2) || now-l.lastRead.Load() >= int64(ka) {
			l.lastWrite.Store(now)
			if _, err := packets.NewControlPacket(packets.PINGREQ).WriteTo(l.conn); err != nil {
				l.report(err)
				return
			}
			pingSent = now
		}
	}
}
