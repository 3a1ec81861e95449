// Package mqtt is the bridge's MQTT receiving transport (MQTT 5), its own
// packet loop over paho.golang's packet codec and package mqttconn's
// buffered connection. A Session holds one broker session: it connects,
// reconciles its subscriptions with the configuration, hands every message
// to one handler in arrival order, and acknowledges a QoS 1/2 message only
// when the handler says so (manual acks, sent in order as MQTT requires).
//
// The handler runs on the goroutine that reads the connection: a message
// is decoded straight into it, with no hand-over to another goroutine
// (which cost a fifth of the bridge's CPU under paho.Client). Its payload
// and topic share one allocation, the packet's body, which the message
// owns: a route may keep them until it acknowledges.
//
// Activation — from the start of a connection attempt to ServiceLevelFull
// — is bounded step by step: each connect attempt (dial, TLS, CONNECT,
// CONNACK) by connect_timeout, at most two attempts; each SUBSCRIBE or
// UNSUBSCRIBE wait by reconcile_timeout, at most four (one UNSUBSCRIBE of
// filters the configuration dropped, one SUBSCRIBE, one retry); and the residue
// window for messages of removed filters by unmatched_grace, at most two.
// The whole activation additionally runs under a context that expires at
// the declared bound 2·connect_timeout + 4·reconcile_timeout +
// 2·unmatched_grace, so the bound that the failover package adds to the
// budgets is true by construction.
package mqtt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/packets"

	"github.com/myriarch/myriarch/internal/bridge/mqttconn"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/transport"
)

func (s *Session) valid() bool { return s.cfg.Tenure == nil || s.cfg.Tenure.Valid() }

// Session is one broker session. Create it with New, run it with Run.
type Session struct {
	cfg   transport.Config
	log   *slog.Logger
	level atomic.Int32

	draining atomic.Bool

	mu            sync.Mutex
	activatedAt   time.Time
	sessionResume bool
	unmatched     atomic.Int64
}

// New validates cfg and returns a session that is not yet connected.
func New(cfg transport.Config) (*Session, error) {
	if len(cfg.Brokers) == 0 || cfg.ClientID == "" || cfg.Handler == nil {
		return nil, errors.New("mqtt session: Brokers, ClientID and Handler are required")
	}
	if _, err := cfg.Activation(); err != nil {
		return nil, err
	}
	if cfg.ReceiveMaximum == 0 {
		cfg.ReceiveMaximum = 1000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Session{cfg: cfg, log: cfg.Logger.With("client_id", cfg.ClientID)}, nil
}

// Level returns the current service level.
func (s *Session) Level() transport.Level { return transport.Level(s.level.Load()) }

// Unmatched counts messages that matched no wanted filter (residue of
// removed subscriptions); they are acknowledged and dropped.
func (s *Session) Unmatched() int64 { return s.unmatched.Load() }

func (s *Session) setLevel(l transport.Level) {
	if transport.Level(s.level.Swap(int32(l))) != l && s.cfg.OnLevel != nil {
		s.cfg.OnLevel(l)
	}
}

// Drain stops handing new messages to the handler; they stay unacknowledged
// in the broker session for the next connection or owner.
func (s *Session) Drain() { s.draining.Store(true) }

// Run connects and serves until ctx ends, reconnecting with backoff after
// a loss. It returns when ctx ends, after a clean DISCONNECT that keeps the
// broker session (session expiry) so that a successor resumes it.
func (s *Session) Run(ctx context.Context) error {
	return transport.Reconnect(ctx, s.cfg, s.valid, s.setLevel, s.connection, s.log)
}

// connection runs one connection: activation, then serving until loss.
func (s *Session) connection(ctx context.Context, attempt int) error {
	actCtx, actCancel := transport.ActivationContext(ctx, s.cfg)
	defer actCancel()

	var l *link
	err := transport.Dial(actCtx, s.cfg, attempt, s.valid, s.log, func(ctx context.Context, broker string) (err error) {
		l, err = s.connect(ctx, broker)
		return err
	})
	if err != nil {
		return err
	}
	defer l.close(true)
	err = transport.Activate(actCtx, s.cfg, s.state(), transport.Reconciler{
		SessionPresent: s.SessionPresent(),
		Unsubscribe:    func(ctx context.Context, filters []string) error { return s.unsubscribe(ctx, l, filters) },
		Subscribe: func(ctx context.Context, subs []transport.Subscription) (map[string]bool, error) {
			return s.subscribe(ctx, l, subs)
		},
	}, s.log, s.setLevel, s.activated)
	if err != nil {
		return err
	}
	// What arrived during activation is handed on now, then every
	// message as the reading goroutine decodes it.
	l.release()

	select {
	case <-ctx.Done():
		// Acknowledgments leave as soon as they are in order, so there is
		// nothing left to wait for before the DISCONNECT.
		return nil
	case <-l.dead:
		return l.deadErr
	}
}

// subscribe sends one SUBSCRIBE for subs and waits, within
// reconcile_timeout, for its SUBACK. A broker that shares packet
// identifiers between directions (mochi-mqtt does) refuses a SUBSCRIBE
// whose identifier equals one of the messages it is redelivering to a
// resumed session (reason 0x91); the next try takes the next identifier,
// so such refusals are retried at once, within the same timeout.
func (s *Session) subscribe(ctx context.Context, l *link, subs []transport.Subscription) (map[string]bool, error) {
	granted := map[string]bool{}
	if len(subs) == 0 {
		return granted, nil
	}
	sctx, cancel := context.WithTimeout(ctx, s.cfg.ReconcileTimeout)
	defer cancel()
	req := &packets.Subscribe{Properties: &packets.Properties{}}
	for _, sub := range subs {
		// Retain As Published keeps the publisher's retain flag on live
		// messages (a broker otherwise clears it), so a route can carry
		// it on. Retain Handling 1 sends the retained messages of a
		// filter only when the subscription is new: a resumed exclusive
		// session that subscribes again after a takeover does not get
		// them a second time.
		req.Subscriptions = append(req.Subscriptions, packets.SubOptions{Topic: sub.Filter, QoS: sub.QoS,
			RetainAsPublished: true, RetainHandling: 1})
	}
	for {
		resp, err := l.request(sctx, packets.SUBSCRIBE, func(id uint16) *packets.ControlPacket {
			req.PacketID = id
			cp := packets.NewControlPacket(packets.SUBSCRIBE)
			cp.Content = req
			return cp
		})
		if err != nil {
			return granted, err
		}
		sa, ok := resp.Content.(*packets.Suback)
		if !ok {
			return granted, fmt.Errorf("expected SUBACK, got %s", resp.PacketType())
		}
		idInUse := len(sa.Reasons) > 0
		for i, code := range sa.Reasons {
			if i < len(subs) && code < 0x80 {
				granted[subs[i].Filter] = true
			}
			idInUse = idInUse && code == 0x91
		}
		if !idInUse || sctx.Err() != nil {
			if len(granted) < len(subs) {
				s.log.Warn("broker refused subscriptions", "reasons", sa.Reasons)
			}
			return granted, nil
		}
	}
}

// unsubscribe removes filters within reconcile_timeout, retrying at once
// on a packet identifier in use (see subscribe).
func (s *Session) unsubscribe(ctx context.Context, l *link, topics []string) error {
	uctx, cancel := context.WithTimeout(ctx, s.cfg.ReconcileTimeout)
	defer cancel()
	for {
		resp, err := l.request(uctx, packets.UNSUBSCRIBE, func(id uint16) *packets.ControlPacket {
			cp := packets.NewControlPacket(packets.UNSUBSCRIBE)
			cp.Content = &packets.Unsubscribe{Topics: topics, PacketID: id, Properties: &packets.Properties{}}
			return cp
		})
		if err != nil {
			return err
		}
		ua, ok := resp.Content.(*packets.Unsuback)
		if !ok {
			return fmt.Errorf("expected UNSUBACK, got %s", resp.PacketType())
		}
		inUse := len(ua.Reasons) > 0
		for _, code := range ua.Reasons {
			inUse = inUse && code == 0x91
		}
		if !inUse {
			return nil // 0x11 (no subscription existed) is fine too
		}
		if uctx.Err() != nil {
			return uctx.Err()
		}
	}
}

// connect dials broker and completes CONNECT/CONNACK within
// connect_timeout; the returned link reads on its own goroutine.
func (s *Session) connect(ctx context.Context, broker string) (*link, error) {
	cctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	defer cancel()
	conn, err := mqttconn.Dial(cctx, broker, s.cfg.TLS)
	if err != nil {
		return nil, err
	}
	expiry := uint32(s.cfg.SessionExpiry / time.Second)
	recvMax := s.cfg.ReceiveMaximum
	problemInfo := byte(1)
	cp := &packets.Connect{
		ProtocolName:    "MQTT",
		ProtocolVersion: 5,
		ClientID:        s.cfg.ClientID,
		CleanStart:      s.cfg.CleanStart,
		KeepAlive:       uint16(s.cfg.KeepAlive / time.Second),
		// RequestProblemInfo is MQTT 5's default, sent explicitly:
		// mochi-mqtt v2.7.9 otherwise strips the user properties of the
		// PUBLISH packets it sends us, and the bridge carries them on.
		Properties: &packets.Properties{SessionExpiryInterval: &expiry, ReceiveMaximum: &recvMax, RequestProblemInfo: &problemInfo},
	}
	if s.cfg.Username != "" {
		cp.UsernameFlag, cp.Username = true, s.cfg.Username
	}
	if len(s.cfg.Password) > 0 {
		cp.PasswordFlag, cp.Password = true, s.cfg.Password
	}
	ca, err := handshake(cctx, conn, cp)
	if err != nil {
		_ = conn.Close()
		if ca != nil {
			return nil, fmt.Errorf("CONNACK reason code %d: %s", ca.ReasonCode, ca.Reason())
		}
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, fmt.Errorf("%w: connect_timeout %v passed: %v", transport.ErrActivation, s.cfg.ConnectTimeout, err)
		}
		return nil, err
	}
	s.mu.Lock()
	s.sessionResume = ca.SessionPresent
	s.mu.Unlock()
	s.log.Info("mqtt connected", "broker", broker, "session_present", ca.SessionPresent)
	return s.start(conn), nil
}

// handshake writes CONNECT and reads the CONNACK within ctx; a refusal
// returns the CONNACK with an error.
func handshake(ctx context.Context, conn *mqttconn.Conn, cp *packets.Connect) (*packets.Connack, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetReadDeadline(dl)
	}
	// A context that ends before its deadline (Run's) ends the wait too.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Now()) })
	defer stop()
	pkt := packets.NewControlPacket(packets.CONNECT)
	pkt.Content = cp
	if _, err := pkt.WriteTo(conn); err != nil {
		return nil, err
	}
	hdr, body, err := conn.ReadPacket()
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("waiting for CONNACK: %w", ctx.Err())
		}
		return nil, fmt.Errorf("waiting for CONNACK: %w", err)
	}
	recv, err := mqttconn.Parse(hdr, body)
	if err != nil {
		return nil, fmt.Errorf("reading CONNACK: %w", err)
	}
	ca, ok := recv.Content.(*packets.Connack)
	if !ok {
		return nil, fmt.Errorf("expected CONNACK, got %s", recv.PacketType())
	}
	if ca.ReasonCode >= 0x80 {
		return ca, errors.New("broker refused the connection")
	}
	if !stop() {
		return nil, fmt.Errorf("waiting for CONNACK: %w", ctx.Err())
	}
	_ = conn.SetReadDeadline(time.Time{})
	return ca, nil
}

// SessionPresent reports whether the broker resumed a stored session on
// the latest connection.
func (s *Session) SessionPresent() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessionResume
}

// properties copies the properties the bridge carries on; nil when there
// are none.
func properties(pp *packets.Properties) *sender.Properties {
	if pp == nil || (len(pp.User) == 0 && pp.ContentType == "" && pp.PayloadFormat == nil && pp.MessageExpiry == nil &&
		pp.ResponseTopic == "" && pp.CorrelationData == nil) {
		return nil
	}
	out := &sender.Properties{ContentType: pp.ContentType, PayloadFormat: pp.PayloadFormat, MessageExpiry: pp.MessageExpiry,
		ResponseTopic: pp.ResponseTopic, CorrelationData: pp.CorrelationData}
	for _, u := range pp.User {
		out.User = append(out.User, sender.UserProperty{Key: u.Key, Value: u.Value})
	}
	return out
}

// handOn hands one received message to the handler, on the link's
// reading goroutine (or, for what arrived during activation, the
// connection's): the tenure and drain checks, then unmatched residue is
// acknowledged and dropped, the rest goes to the handler.
func (s *Session) handOn(r *received) {
	if s.draining.Load() || !s.valid() {
		return // left unacknowledged for the next owner
	}
	if !transport.Wanted(s.cfg.Subscriptions, r.msg.Topic) {
		s.unmatched.Add(1)
		s.mu.Lock()
		inGrace := time.Since(s.activatedAt) < s.cfg.UnmatchedGrace || s.activatedAt.IsZero()
		s.mu.Unlock()
		if !inGrace {
			s.log.Warn("message matches no configured filter; acknowledged and dropped", "topic", r.msg.Topic)
		}
		r.ack()
		return
	}
	s.cfg.Handler(&r.msg, r.ack)
}

// activated records when the latest activation completed.
func (s *Session) activated(at time.Time) {
	s.mu.Lock()
	s.activatedAt = at
	s.mu.Unlock()
}

// state is the session's subscription state file.
func (s *Session) state() transport.SubscriptionState {
	return transport.SubscriptionState{File: s.cfg.StateFile, ClientID: s.cfg.ClientID, Log: s.log}
}
