package pgleader

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The dedicated sessions (lock and listener) carry the keepalive
// parameters derived from T in their startup packet.

// ConnectSession opens a dedicated session with the keepalive parameters in
// the startup packet, like the lock session. Use it for the LISTEN/NOTIFY
// listener. The caller closes it.
func (e *Elector) ConnectSession(ctx context.Context) (*pgx.Conn, error) {
	if !e.noUserTO.Load() {
		conn, err := pgx.ConnectConfig(ctx, e.sessionConfig(true))
		if err == nil || !isUserTimeoutRefusal(err) {
			return conn, err
		}
		e.noUserTO.Store(true)
		e.warnOnce.Do(func() {
			e.log.Warn("PostgreSQL refuses tcp_user_timeout; the lock and listener sessions use the keepalive settings without it", "error", err)
		})
	}
	return pgx.ConnectConfig(ctx, e.sessionConfig(false))
}

// UserTimeoutRefused reports whether the server refused tcp_user_timeout.
func (e *Elector) UserTimeoutRefused() bool { return e.noUserTO.Load() }

func (e *Elector) sessionConfig(withUserTimeout bool) *pgx.ConnConfig {
	c := e.base.Copy()
	if c.RuntimeParams == nil {
		c.RuntimeParams = map[string]string{}
	}
	for k, v := range e.k.RuntimeParams(withUserTimeout) {
		c.RuntimeParams[k] = v
	}
	if c.RuntimeParams["application_name"] == "" {
		c.RuntimeParams["application_name"] = "myriarch-pgleader"
	}
	// A follower's lock session waits on the lock for up to a retry
	// interval; a statement_timeout of the database or role (common in
	// production) would cut every wait short. Every statement on these
	// sessions has a client-side timeout of its own.
	if _, set := c.RuntimeParams["statement_timeout"]; !set {
		c.RuntimeParams["statement_timeout"] = "0"
	}
	return c
}

// session is the dedicated lock session.
type session struct {
	conn *pgx.Conn
	pid  uint32
}

// closeSocket closes the socket under the driver (safe while a query runs).
func (s *session) closeSocket() {
	if c := s.conn.PgConn().Conn(); c != nil {
		_ = c.Close()
	}
}

// hardClose closes the socket without waiting for the server; the server
// sees a FIN (or nothing when the network is gone) and releases the lock.
func (s *session) hardClose() {
	s.closeSocket()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_ = s.conn.Close(ctx)
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}
