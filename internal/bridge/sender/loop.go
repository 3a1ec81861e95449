package sender

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// The loop that the connection-oriented senders (mqtt, mqtt311) share.

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

// AwaitDone waits for done, the end of a sender's goroutine that the
// caller has just told to stop, within ctx.
func AwaitDone(ctx context.Context, done <-chan struct{}) error {
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
