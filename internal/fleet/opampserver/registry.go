package opampserver

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"
	"github.com/open-telemetry/opamp-go/server/types"
)

// registry is who this process serves: every open connection (a
// WebSocket, or one plain-HTTP request) by its opamp-go connection, the
// WebSocket agents by instance UID, and the plain-HTTP agents that polled
// here lately. Server embeds it; the parts that reach agents from outside
// a message (commands, offers, push, identity) find them through it.
type registry struct {
	mu    sync.Mutex
	conns map[types.Connection]*agentConn
	byUID map[string]*agentConn // WebSocket agents by uid
	http  map[string]*httpAgent // plain-HTTP agents known to this process
}

func newRegistry() registry {
	return registry{conns: map[types.Connection]*agentConn{}, byUID: map[string]*agentConn{}, http: map[string]*httpAgent{}}
}

type agentConn struct {
	conn   types.Connection
	connID string
	ws     bool
	// auth is how the connection authenticated.
	auth connAuth
	// lastMsg is when the last message arrived (unix nanoseconds).
	lastMsg atomic.Int64

	mu       sync.Mutex
	uid      string
	seen     reported
	sentHash string
	// hb is the agent's heartbeat interval in seconds as its heartbeats
	// show it (0: none seen yet); pending is a credential offer that waits
	// for it (security.go).
	hb      uint64
	pending int
	// pendingSince is when the offer started waiting, and maxGap the
	// longest silence between two messages since: an agent that always
	// talks more often than its heartbeat interval sends no heartbeat, so
	// after Options.LearnHeartbeatWithin its offer goes out with maxGap
	// (at most its interval) instead of never.
	pendingSince time.Time
	maxGap       time.Duration
}

// sendTimeout bounds one message sent to a WebSocket agent outside a
// response (a push, the reconcile).
const sendTimeout = 10 * time.Second

// send sends msg to the WebSocket agent of ac, addressed to its instance
// UID, within sendTimeout. The caller holds ac.mu.
func (ac *agentConn) send(ctx context.Context, msg *protobufs.ServerToAgent) error {
	msg.InstanceUid, _ = ParseUID(ac.uid)
	sctx, cancel := context.WithTimeout(ctx, sendTimeout)
	defer cancel()
	return ac.conn.Send(sctx, msg)
}

type httpAgent struct {
	seen     atomic.Int64 // unix nanoseconds of the last poll
	mu       sync.Mutex
	dirty    bool // desired config may have changed
	cmdCheck bool // a restart may be pending (commands.go)
	pkgCheck bool // a package offer may be pending (packages.go)
	// pkgWait is the offer sent to the agent that it has not acknowledged
	// yet, and its polls here since (packages.go).
	pkgWait  pkgWait
	sentHash string
	rep      reported
	// byCred: the agent has polled here with its credential (or
	// certificate), so a poll with the secret for its UID is not its own.
	byCred bool
}

// reported is what one connection (or one plain-HTTP agent in this
// process) last reported, so that repeats cost no write and no event.
type reported struct {
	caps      uint64
	healthy   *bool
	lastError string
	// hash is the remote config hash the agent reported, valid once known
	// is set: after a reconnect the agent's first message may carry none
	// of its state, and a config sent before the agent has told which one
	// it runs would be taken as "unchanged" and reported APPLIED, even
	// when that very config had FAILED (the OpenTelemetry supervisor does
	// this). So nothing is sent until a full state or a remote-config
	// status has arrived on this connection.
	hash  string
	known bool
}

// wsConn is the WebSocket connection of uid here, or nil.
func (r *registry) wsConn(uid string) *agentConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byUID[uid]
}

// mark applies set to uid's plain-HTTP bookkeeping if it polls here (so
// that its next poll looks again: at its config, a restart, an offer), and
// returns its WebSocket connection here, or nil.
func (r *registry) mark(uid string, set func(*httpAgent)) *agentConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ha := r.http[uid]; ha != nil {
		ha.mu.Lock()
		set(ha)
		ha.mu.Unlock()
	}
	return r.byUID[uid]
}

// knownHTTP reports whether uid polls this process over plain HTTP.
func (r *registry) knownHTTP(uid string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.http[uid] != nil
}

// wsCount is the number of open WebSocket connections.
func (r *registry) wsCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.conns {
		if c.ws {
			n++
		}
	}
	return n
}

// wsOpen returns the open WebSocket connections.
func (r *registry) wsOpen() []types.Connection {
	r.mu.Lock()
	defer r.mu.Unlock()
	open := make([]types.Connection, 0, len(r.conns))
	for c, ac := range r.conns {
		if ac.ws {
			open = append(open, c)
		}
	}
	return open
}

// sweep is the reconcile's view: the WebSocket agents here, by UID. Every
// plain-HTTP agent is told to look at everything on its next poll, and one
// that has not polled here within idle is forgotten (it polls elsewhere
// now, or stopped; a new poll starts afresh).
func (r *registry) sweep(idle time.Duration) ([]string, map[string]*agentConn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	uids := make([]string, 0, len(r.byUID))
	acs := make(map[string]*agentConn, len(r.byUID))
	for uid, ac := range r.byUID {
		uids = append(uids, uid)
		acs[uid] = ac
	}
	for uid, ha := range r.http {
		if time.Since(time.Unix(0, ha.seen.Load())) > idle {
			delete(r.http, uid)
			continue
		}
		ha.mu.Lock()
		ha.dirty, ha.cmdCheck, ha.pkgCheck = true, true, true
		ha.mu.Unlock()
	}
	return uids, acs
}
