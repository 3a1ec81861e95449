package pgleader

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Listen keeps a dedicated listener session, opened like the lock session
// with the keepalive parameters (see ConnectSession), LISTENing on channels,
// and calls fn for every notification until ctx ends. After the session
// fails it reconnects (after the follower retry) and calls onReconnect, if
// not nil, once the channels are listened to again: notifications sent
// while no session listened are lost, so the caller re-reads what it
// watches. fn and onReconnect run on Listen's goroutine. Listen returns nil
// when ctx ends.
func (e *Elector) Listen(ctx context.Context, channels []string, fn func(*pgconn.Notification), onReconnect func()) error {
	if len(channels) == 0 {
		return errors.New("pgleader: Listen needs at least one channel")
	}
	first := true
	for {
		err := e.listenOnce(ctx, channels, fn, func() {
			if !first && onReconnect != nil {
				onReconnect()
			}
			first = false
		})
		if ctx.Err() != nil {
			return nil
		}
		e.log.Warn("listener session failed; reconnecting", "error", err)
		if !sleepCtx(ctx, e.retryDelay()) {
			return nil
		}
	}
}

func (e *Elector) listenOnce(ctx context.Context, channels []string, fn func(*pgconn.Notification), ready func()) error {
	cctx, cancel := context.WithTimeout(ctx, e.k.ConfirmTimeout)
	conn, err := e.ConnectSession(cctx)
	if err != nil {
		cancel()
		return err
	}
	defer func() {
		c, cl := context.WithTimeout(context.Background(), ListenerCloseTimeout)
		defer cl()
		_ = conn.Close(c)
	}()
	for _, ch := range channels {
		if _, err := conn.Exec(cctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			cancel()
			return fmt.Errorf("LISTEN %s: %w", ch, err)
		}
	}
	cancel()
	ready()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		fn(n)
	}
}
