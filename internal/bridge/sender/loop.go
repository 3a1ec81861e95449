package sender

import (
	"context"
	"crypto/tls"
	"log/slog"
	"sync"
	"time"
)

// The loop that the connection-oriented senders (mqtt, mqtt311) share.

// MQTTConfig configures an MQTT sender: mqtt.Config (MQTT 5) and
// mqtt311.Config (MQTT 3.1.1) are this type, so that one set of settings
// opens either.
type MQTTConfig struct {
	Broker         string
	ClientID       string
	Username       string
	Password       []byte
	TLS            *tls.Config
	QoS            byte
	KeepAlive      time.Duration
	ConnectTimeout time.Duration
	// Timeout fails a message whose PUBACK (PUBCOMP at QoS 2) has not
	// arrived in time; the connection is then considered broken and
	// recycled.
	Timeout time.Duration
	// MaxInFlight bounds the messages published and not yet acknowledged
	// by the MQTT 3.1.1 sender (default mqtt311.DefaultMaxInFlight): MQTT
	// 3.1.1 has no receive maximum to learn it from. The MQTT 5 sender
	// takes the broker's receive maximum and ignores it.
	MaxInFlight int
	Logger      *slog.Logger
}

// WithDefaults returns c with the defaults filled in: ConnectTimeout 30s,
// Timeout 10s, Logger slog.Default().
func (c MQTTConfig) WithDefaults() MQTTConfig {
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = 30 * time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Wake signals c, a channel of capacity one, without blocking: a signal
// already pending wakes the receiver just as well.
func Wake(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Reconnect runs session, one connection each time, until ctx ends. After
// each session it calls ended with the session's error (the sender fails
// what waited meanwhile, so that the route's retry and dead-letter policy
// applies instead of an unbounded wait for the broker); then, unless ctx
// has ended, it waits a backoff that doubles from 100ms up to 5s.
func Reconnect(ctx context.Context, log *slog.Logger, session func() error, ended func(error)) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := session()
		ended(err)
		if ctx.Err() != nil {
			return
		}
		log.Warn("mqtt sender disconnected; reconnecting", "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// Close marks the sender closed (closed, guarded by mu: Enqueue refuses
// from now on), stops its goroutine (cancel) and waits for done, the end
// of that goroutine, within ctx.
func Close(ctx context.Context, mu *sync.Mutex, closed *bool, cancel context.CancelFunc, done <-chan struct{}) error {
	mu.Lock()
	*closed = true
	mu.Unlock()
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Enqueue appends it to queue, both guarded by mu, and reports true; once
// the sender is closed it fails done with ErrClosed instead and reports
// false. It is the start of the Send of a sender with a queue.
func Enqueue[T any](mu *sync.Mutex, closed *bool, queue *[]T, it T, done func(error)) bool {
	mu.Lock()
	if *closed {
		mu.Unlock()
		done(ErrClosed)
		return false
	}
	*queue = append(*queue, it)
	mu.Unlock()
	return true
}
