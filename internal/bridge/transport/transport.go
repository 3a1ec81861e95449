// Package transport is what the bridge's receiving transports share, and
// what the rest of the bridge sees of them: the message model (Message,
// Handler, the topic filter Match), the wanted subscriptions and the
// service levels, the session configuration and the activation bound it
// declares, the reconnect loop, and the subscription state file. The MQTT 5
// transport (transport/mqtt) and the MQTT 3.1.1 one (transport/mqtt311)
// implement a session each on top of it; routing and the runtime import
// this package, not a protocol's.
package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/bridge/activation"
	"github.com/myriarch/myriarch/internal/bridge/fence"
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

// Reconnect is a session's life (its Run), for either protocol version:
// connection after connection, with a backoff from 100ms doubling up to
// max(1s, connect_timeout) (reset after a connection that lasted 10s),
// until ctx ends (nil) or the tenure is invalid (ErrTenureEnded, checked
// before every connection, so that an ended tenure never takes the
// client_id back). The service level is None between connections and
// after the last.
func Reconnect(ctx context.Context, cfg Config, valid func() bool, setLevel func(Level),
	connection func(ctx context.Context, attempt int) error, log *slog.Logger) error {
	defer setLevel(LevelNone)
	backoff := 100 * time.Millisecond
	attempt := 0
	for {
		if !valid() {
			log.Warn("lease tenure ended; not connecting")
			return ErrTenureEnded
		}
		start := time.Now()
		err := connection(ctx, attempt)
		setLevel(LevelNone)
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
		log.Warn("mqtt session lost; reconnecting", "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, max(time.Second, cfg.ConnectTimeout))
	}
}

// ErrActivation wraps an activation step that ran out of its time.
var ErrActivation = errors.New("mqtt activation")

// ActivationContext is the context of one connection's activation: it
// ends at the declared bound (Config.Activation), so that the bound the
// failover package adds to the budgets is true by construction.
func ActivationContext(ctx context.Context, cfg Config) (context.Context, context.CancelFunc) {
	act, _ := cfg.Activation()
	return context.WithTimeout(ctx, act.Bound)
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
