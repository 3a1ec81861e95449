// Package mqtt is the bridge's MQTT receiving transport on paho.golang
// (MQTT 5). A Session holds one broker session: it connects, reconciles
// its subscriptions with the configuration, hands every message to one
// handler in arrival order, and acknowledges a QoS 1/2 message only when
// the handler says so (manual acks, sent in order as MQTT requires).
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
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/bridge/activation"
	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/mqttconn"
	"github.com/myriarch/myriarch/internal/bridge/sender"
)

// Level is a session's service level.
type Level int32

// Service levels.
const (
	// LevelNone: not connected.
	LevelNone Level = iota
	// LevelDegraded: connected, but not every wanted subscription is
	// granted (reconcile in progress or refused by the broker).
	LevelDegraded
	// LevelFull: connected, every wanted subscription granted, the
	// handler registered.
	LevelFull
)

func (l Level) String() string {
	switch l {
	case LevelDegraded:
		return "degraded"
	case LevelFull:
		return "full"
	}
	return "none"
}

// Subscription is one wanted topic filter.
type Subscription struct {
	Filter string
	QoS    byte
}

// Message is one received message.
type Message struct {
	Topic    string
	Payload  []byte
	QoS      byte
	Retain   bool
	Received time.Time
	// Properties are the MQTT 5 properties carried on (nil: none).
	Properties *sender.Properties
}

// Handler receives every message in arrival order from one goroutine.
// It must call ack exactly once, when the message may be forgotten; it may
// block, which is the backpressure that bounds what the bridge holds (the
// broker then stops at the session's receive maximum).
type Handler func(m *Message, ack func())

// Config configures a Session.
type Config struct {
	Brokers          []string
	ClientID         string
	CleanStart       bool
	SessionExpiry    time.Duration
	KeepAlive        time.Duration
	Username         string
	Password         []byte
	TLS              *tls.Config
	ConnectTimeout   time.Duration
	ReconcileTimeout time.Duration
	UnmatchedGrace   time.Duration
	ReceiveMaximum   uint16
	Subscriptions    []Subscription
	Handler          Handler
	// OnLevel is called on every service-level change, from the
	// session's goroutine; it must not block.
	OnLevel func(Level)
	Logger  *slog.Logger
	// AckInterval is how often paho sends the acknowledgments the handler
	// released (default 2ms).
	AckInterval time.Duration
	// StateFile, if set, remembers the filters this client_id subscribed,
	// so that a resumed session's filters that the configuration no longer
	// wants are unsubscribed during activation. MQTT cannot list a
	// session's subscriptions, so without it they stay until the session
	// expires (their messages are acknowledged and dropped).
	StateFile string
	// Tenure, if set, is the lease tenure the session works for. It is
	// checked at every point of action: before each connection attempt
	// (so a deposed owner never reconnects with the shared client_id and
	// kicks its successor off the broker session), before a message is
	// handed to the handler, and before an acknowledgment. Once it is
	// invalid, Run returns without connecting again.
	Tenure fence.Tenure
}

// ErrTenureEnded is returned by Run when the session's tenure is no longer
// valid.
var ErrTenureEnded = errors.New("mqtt session: the lease tenure ended")

// Activation is the bound this transport declares to the failover package.
func (c Config) Activation() (failover.Activation, error) {
	return activation.MQTT(c.ConnectTimeout, c.ReconcileTimeout, c.UnmatchedGrace)
}

// Session is one broker session. Create it with New, run it with Run.
type Session struct {
	cfg   Config
	log   *slog.Logger
	level atomic.Int32

	draining atomic.Bool

	mu            sync.Mutex
	activatedAt   time.Time
	sessionResume bool
	unmatched     atomic.Int64
}

// New validates cfg and returns a session that is not yet connected.
func New(cfg Config) (*Session, error) {
	if len(cfg.Brokers) == 0 || cfg.ClientID == "" || cfg.Handler == nil {
		return nil, errors.New("mqtt session: Brokers, ClientID and Handler are required")
	}
	if _, err := cfg.Activation(); err != nil {
		return nil, err
	}
	if cfg.ReceiveMaximum == 0 {
		cfg.ReceiveMaximum = 1000
	}
	if cfg.AckInterval <= 0 {
		cfg.AckInterval = 2 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Session{cfg: cfg, log: cfg.Logger.With("client_id", cfg.ClientID)}, nil
}

// Level returns the current service level.
func (s *Session) Level() Level { return Level(s.level.Load()) }

// Unmatched counts messages that matched no wanted filter (residue of
// removed subscriptions); they are acknowledged and dropped.
func (s *Session) Unmatched() int64 { return s.unmatched.Load() }

func (s *Session) setLevel(l Level) {
	if Level(s.level.Swap(int32(l))) != l && s.cfg.OnLevel != nil {
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
	defer s.setLevel(LevelNone)
	backoff := 100 * time.Millisecond
	attempt := 0
	for {
		if !s.valid() {
			s.log.Warn("lease tenure ended; not connecting")
			return ErrTenureEnded
		}
		start := time.Now()
		err := s.connection(ctx, attempt)
		s.setLevel(LevelNone)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrTenureEnded) {
			return err
		}
		attempt++
		if time.Since(start) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		s.log.Warn("mqtt session lost; reconnecting", "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, max(time.Second, s.cfg.ConnectTimeout))
	}
}

func (s *Session) valid() bool { return s.cfg.Tenure == nil || s.cfg.Tenure.Valid() }

// ErrActivation wraps an activation step that ran out of its time.
var ErrActivation = errors.New("mqtt activation")

// connection runs one connection: activation, then serving until loss.
func (s *Session) connection(ctx context.Context, attempt int) error {
	act, _ := s.cfg.Activation()
	actCtx, actCancel := context.WithTimeout(ctx, act.Bound)
	defer actCancel()

	lost := make(chan error, 1)
	report := func(err error) {
		select {
		case lost <- err:
		default:
		}
	}
	var cli *paho.Client
	var err error
	// Connect: at most two attempts, each within connect_timeout.
	for try := range 2 {
		if !s.valid() {
			return ErrTenureEnded
		}
		broker := s.cfg.Brokers[(attempt*2+try)%len(s.cfg.Brokers)]
		cli, err = s.connect(actCtx, broker, report)
		if err == nil {
			break
		}
		s.log.Warn("mqtt connect failed", "broker", broker, "err", err)
		if actCtx.Err() != nil {
			break
		}
	}
	if err != nil {
		return err
	}
	defer func() {
		_ = cli.Disconnect(&paho.Disconnect{ReasonCode: 0})
		<-cli.Done()
	}()
	s.setLevel(LevelDegraded)

	// Reconcile: one UNSUBSCRIBE for the filters a resumed session holds
	// that the configuration no longer wants, one SUBSCRIBE for every
	// wanted filter, and the refused ones once more. Each wait is bounded
	// by reconcile_timeout: at most three of the four the bound allows.
	previous := s.loadState()
	if !s.SessionPresent() {
		previous = nil // a new broker session holds no subscriptions
	}
	if stale := staleFilters(previous, s.cfg.Subscriptions); len(stale) > 0 {
		if err := s.unsubscribe(actCtx, cli, stale); err != nil {
			return fmt.Errorf("%w: unsubscribe removed filters: %v", ErrActivation, err)
		}
		s.log.Info("unsubscribed filters no longer configured", "filters", stale)
		previous = nil
	}
	granted, err := s.subscribe(actCtx, cli, s.cfg.Subscriptions)
	if err != nil {
		return fmt.Errorf("%w: subscribe: %v", ErrActivation, err)
	}
	if missing := missingOf(s.cfg.Subscriptions, granted); len(missing) > 0 {
		g2, err := s.subscribe(actCtx, cli, missing)
		if err != nil {
			return fmt.Errorf("%w: subscribe retry: %v", ErrActivation, err)
		}
		for k := range g2 {
			granted[k] = true
		}
	}
	s.saveState(previous, granted)
	if missing := missingOf(s.cfg.Subscriptions, granted); len(missing) > 0 {
		s.log.Error("broker refused subscriptions; serving degraded", "filters", filters(missing))
	} else {
		s.mu.Lock()
		s.activatedAt = time.Now()
		s.mu.Unlock()
		s.setLevel(LevelFull)
	}

	select {
	case <-ctx.Done():
		// Let the released acknowledgments go out before the DISCONNECT.
		time.Sleep(3 * s.cfg.AckInterval)
		return nil
	case err := <-lost:
		return err
	}
}

func filters(subs []Subscription) []string {
	out := make([]string, len(subs))
	for i, s := range subs {
		out[i] = s.Filter
	}
	return out
}

func missingOf(want []Subscription, granted map[string]bool) []Subscription {
	var out []Subscription
	for _, w := range want {
		if !granted[w.Filter] {
			out = append(out, w)
		}
	}
	return out
}

// subscribe sends one SUBSCRIBE for subs and waits, within
// reconcile_timeout, for its SUBACK. A broker that shares packet
// identifiers between directions (mochi-mqtt does) refuses a SUBSCRIBE
// whose identifier equals one of the messages it is redelivering to a
// resumed session (reason 0x91); paho then moves to the next identifier,
// so such refusals are retried at once, within the same timeout.
func (s *Session) subscribe(ctx context.Context, cli *paho.Client, subs []Subscription) (map[string]bool, error) {
	granted := map[string]bool{}
	if len(subs) == 0 {
		return granted, nil
	}
	sctx, cancel := context.WithTimeout(ctx, s.cfg.ReconcileTimeout)
	defer cancel()
	req := &paho.Subscribe{}
	for _, sub := range subs {
		// Retain As Published keeps the publisher's retain flag on live
		// messages (a broker otherwise clears it), so a route can carry
		// it on. Retain Handling 1 sends the retained messages of a
		// filter only when the subscription is new: a resumed exclusive
		// session that subscribes again after a takeover does not get
		// them a second time.
		req.Subscriptions = append(req.Subscriptions, paho.SubscribeOptions{Topic: sub.Filter, QoS: sub.QoS,
			RetainAsPublished: true, RetainHandling: 1})
	}
	for {
		sa, err := cli.Subscribe(sctx, req)
		if sa == nil {
			return granted, err
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
func (s *Session) unsubscribe(ctx context.Context, cli *paho.Client, topics []string) error {
	uctx, cancel := context.WithTimeout(ctx, s.cfg.ReconcileTimeout)
	defer cancel()
	for {
		ua, err := cli.Unsubscribe(uctx, &paho.Unsubscribe{Topics: topics})
		if ua == nil {
			return err
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

// staleFilters is previous minus the wanted filters, sorted.
func staleFilters(previous []string, want []Subscription) []string {
	var out []string
	for _, p := range previous {
		if !slices.ContainsFunc(want, func(w Subscription) bool { return w.Filter == p }) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

func (s *Session) loadState() []string {
	if s.cfg.StateFile == "" {
		return nil
	}
	b, err := os.ReadFile(s.cfg.StateFile)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("reading the subscription state", "file", s.cfg.StateFile, "err", err)
		}
		return nil
	}
	var st struct {
		Filters []string `json:"filters"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		s.log.Warn("ignoring a corrupt subscription state", "file", s.cfg.StateFile, "err", err)
		return nil
	}
	return st.Filters
}

// saveState records what the broker session may hold now: the granted
// filters plus any earlier ones not yet unsubscribed.
func (s *Session) saveState(previous []string, granted map[string]bool) {
	if s.cfg.StateFile == "" {
		return
	}
	set := map[string]bool{}
	for _, p := range previous {
		set[p] = true
	}
	for f := range granted {
		set[f] = true
	}
	filters := make([]string, 0, len(set))
	for f := range set {
		filters = append(filters, f)
	}
	slices.Sort(filters)
	b, _ := json.Marshal(map[string]any{"client_id": s.cfg.ClientID, "filters": filters})
	tmp := s.cfg.StateFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o640); err != nil {
		s.log.Warn("writing the subscription state", "file", tmp, "err", err)
		return
	}
	if err := os.Rename(tmp, s.cfg.StateFile); err != nil {
		s.log.Warn("writing the subscription state", "file", s.cfg.StateFile, "err", err)
	}
}

// connect dials broker and completes CONNECT/CONNACK within connect_timeout.
func (s *Session) connect(ctx context.Context, broker string, report func(error)) (*paho.Client, error) {
	cctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	defer cancel()
	conn, err := mqttconn.Dial(cctx, broker, s.cfg.TLS)
	if err != nil {
		return nil, err
	}
	cli := paho.NewClient(paho.ClientConfig{
		ClientID:                   s.cfg.ClientID,
		Conn:                       conn,
		EnableManualAcknowledgment: true,
		SendAcksInterval:           s.cfg.AckInterval,
		PacketTimeout:              s.cfg.ReconcileTimeout,
		OnPublishReceived:          []func(paho.PublishReceived) (bool, error){s.onPublish},
		OnClientError:              func(err error) { report(err) },
		OnServerDisconnect: func(d *paho.Disconnect) {
			reason := ""
			if d.Properties != nil {
				reason = d.Properties.ReasonString
			}
			report(fmt.Errorf("broker sent DISCONNECT (reason code %d) %s", d.ReasonCode, reason))
		},
	})
	expiry := uint32(s.cfg.SessionExpiry / time.Second)
	recvMax := s.cfg.ReceiveMaximum
	cp := &paho.Connect{
		ClientID:   s.cfg.ClientID,
		CleanStart: s.cfg.CleanStart,
		KeepAlive:  uint16(s.cfg.KeepAlive / time.Second),
		// RequestProblemInfo is MQTT 5's default, sent explicitly:
		// mochi-mqtt v2.7.9 otherwise strips the user properties of the
		// PUBLISH packets it sends us, and the bridge carries them on.
		Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry, ReceiveMaximum: &recvMax, RequestProblemInfo: true},
	}
	if s.cfg.Username != "" {
		cp.UsernameFlag, cp.Username = true, s.cfg.Username
	}
	if len(s.cfg.Password) > 0 {
		cp.PasswordFlag, cp.Password = true, s.cfg.Password
	}
	ca, err := cli.Connect(cctx, cp)
	if err != nil {
		_ = conn.Close()
		if ca != nil {
			return nil, fmt.Errorf("CONNACK reason code %d: %w", ca.ReasonCode, err)
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("%w: connect_timeout %v passed: %v", ErrActivation, s.cfg.ConnectTimeout, err)
		}
		return nil, err
	}
	s.mu.Lock()
	s.sessionResume = ca.SessionPresent
	s.mu.Unlock()
	s.log.Info("mqtt connected", "broker", broker, "session_present", ca.SessionPresent)
	return cli, nil
}

// SessionPresent reports whether the broker resumed a stored session on
// the latest connection.
func (s *Session) SessionPresent() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessionResume
}

// properties copies the properties the bridge carries on; nil when there
// are none (the common case costs no allocation).
func properties(pp *paho.PublishProperties) *sender.Properties {
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

func (s *Session) onPublish(pr paho.PublishReceived) (bool, error) {
	p := pr.Packet
	cli := pr.Client
	if s.draining.Load() || !s.valid() {
		return true, nil // left unacknowledged for the next owner
	}
	if !s.wanted(p.Topic) {
		s.unmatched.Add(1)
		s.mu.Lock()
		inGrace := time.Since(s.activatedAt) < s.cfg.UnmatchedGrace || s.activatedAt.IsZero()
		s.mu.Unlock()
		if !inGrace {
			s.log.Warn("message matches no configured filter; acknowledged and dropped", "topic", p.Topic)
		}
		if s.valid() {
			_ = cli.Ack(p)
		}
		return true, nil
	}
	m := &Message{Topic: p.Topic, Payload: p.Payload, QoS: p.QoS, Retain: p.Retain, Received: time.Now(), Properties: properties(p.Properties)}
	s.cfg.Handler(m, func() {
		if s.valid() {
			_ = cli.Ack(p)
		}
	})
	return true, nil
}

func (s *Session) wanted(topic string) bool {
	for _, sub := range s.cfg.Subscriptions {
		if Match(sub.Filter, topic) {
			return true
		}
	}
	return false
}

// Match reports whether topic matches filter; a $share/<group>/ prefix is
// ignored, and wildcards do not match topics starting with '$'.
func Match(filter, topic string) bool {
	if rest, ok := strings.CutPrefix(filter, "$share/"); ok {
		if _, f, ok := strings.Cut(rest, "/"); ok {
			filter = f
		}
	}
	if strings.HasPrefix(topic, "$") && (strings.HasPrefix(filter, "+") || strings.HasPrefix(filter, "#")) {
		return false
	}
	for {
		fl, frest, fmore := strings.Cut(filter, "/")
		tl, trest, tmore := strings.Cut(topic, "/")
		switch {
		case fl == "#":
			return true
		case fl != "+" && fl != tl:
			return false
		}
		if !fmore || !tmore {
			// "a/#" also matches "a".
			return fmore == tmore || (!tmore && frest == "#")
		}
		filter, topic = frest, trest
	}
}
