package opampserver

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"
	"github.com/open-telemetry/opamp-go/server/types"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// Serving connections and messages: a connection is authenticated and
// admitted before the upgrade (onConnecting), registered (onConnected,
// onClose), and each message is checked against the limits, stored
// (report.go) and answered with what the agent is due: its credential
// (security.go), a restart command (commands.go), package offers
// (packages.go), its desired config (configs.go).

func (s *Server) onConnecting(r *http.Request) types.ConnectionResponse {
	refuse := func(code int, retry string) types.ConnectionResponse {
		s.mRejected.Inc()
		resp := types.ConnectionResponse{Accept: false, HTTPStatusCode: code}
		if retry != "" {
			resp.HTTPResponseHeader = map[string]string{"Retry-After": retry}
		}
		return resp
	}
	if s.stopping.Load() {
		return refuse(http.StatusServiceUnavailable, "1")
	}
	// Authenticated by the body guard before the body was read.
	a, code, retry, src := s.authOf(r)
	if code != 0 {
		return refuse(code, retry)
	}
	ws := r.Header.Get("Upgrade") != ""
	now := time.Now()
	if a.uid == "" {
		// The secret: a source whose secret connection was refused waits
		// (identity.go), before the upgrade, so that clients back off.
		if wait := s.backoff.wait(src, now); wait > 0 {
			if n, ok := s.storm.hit("backoff "+src, now); ok {
				s.log.Warn("refusing connections with the enrollment secret from a source whose enrollment was refused (a revoked or duplicate agent retrying)",
					"source", src, "refused", n, "retry_after_s", retryAfter(wait))
			}
			return refuse(http.StatusTooManyRequests, retryAfter(wait))
		}
	}
	if a.uid != "" {
		// A credential names its UID before the upgrade: a duplicate or a
		// reconnect storm is refused here, so the client backs off. A
		// plain-HTTP poll with the credential of an agent connected here
		// over WebSocket is a second transport for one UID: refused too.
		if ws && !s.reconnects.Allow(a.uid) {
			return refuse(http.StatusTooManyRequests, "30")
		}
		other := ""
		if s.liveConn(a.uid) != nil {
			other = "this replica"
		} else if !ws && !s.knownHTTP(a.uid) {
			// The first poll here: the agent may be connected over
			// WebSocket to another replica. Later polls are not checked
			// again (one query per new plain-HTTP agent, not per poll).
			ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
			rep, ok, err := s.o.Store.ConnectedElsewhere(ctx, a.uid, HTTPConnID, s.o.OfflineAfter)
			cancel()
			if err != nil {
				s.log.Warn("checking an agent's connection failed", "agent", a.uid, "error", err)
				return refuse(http.StatusServiceUnavailable, "5")
			}
			if ok {
				other = "replica " + rep
			}
		}
		if other != "" {
			tr := "plain HTTP"
			if ws {
				tr = "WebSocket"
			}
			if n, ok := s.storm.hit("second "+a.uid, now); ok {
				s.log.Warn("refused a second connection for an agent that is connected over WebSocket; is its credential copied?",
					"agent", a.uid, "source", src, "transport", tr, "connected_to", other, "count", n)
				s.ev.add(a.uid, now, store.EventEnrollRefused,
					countDetail(fmt.Sprintf("a second connection with the agent's credential over %s from %s refused (409): the agent is connected over WebSocket to %s", tr, src, other), n))
			}
			return refuse(http.StatusConflict, "30")
		}
	}
	method := "secret"
	switch {
	case a.cert:
		method = "certificate"
	case a.uid != "":
		method = "credential"
	}
	s.mAuth.WithLabelValues(method).Inc()
	return types.ConnectionResponse{Accept: true, ConnectionCallbacks: types.ConnectionCallbacks{
		OnConnected:       func(ctx context.Context, c types.Connection) { s.onConnected(ctx, c, a) },
		OnMessage:         s.onMessage,
		OnConnectionClose: s.onClose,
	}}
}

func isWS(c types.Connection) bool {
	// Plain HTTP connections cannot Send; the server's WebSocket type can.
	return !strings.Contains(fmt.Sprintf("%T", c), "httpConnection")
}

func (s *Server) onConnected(_ context.Context, c types.Connection, a connAuth) {
	ac := &agentConn{conn: c, ws: isWS(c), auth: a}
	ac.lastMsg.Store(time.Now().UnixNano())
	if ac.ws {
		setReadLimit(c, s.o.MaxMessageBytes)
		ac.connID = s.o.Nonce + "#" + strconv.FormatInt(s.seq.Add(1), 10)
		s.mConnects.Inc()
	} else {
		ac.connID = HTTPConnID
	}
	s.mu.Lock()
	s.conns[c] = ac
	s.mu.Unlock()
}

func (s *Server) onClose(c types.Connection) {
	s.mu.Lock()
	ac := s.conns[c]
	delete(s.conns, c)
	if ac != nil && ac.ws && ac.uid != "" && s.byUID[ac.uid] == ac {
		delete(s.byUID, ac.uid)
	}
	s.mu.Unlock()
	if ac == nil || !ac.ws || ac.uid == "" || s.stopping.Load() {
		// On a planned stop the final flush marks all of them at once.
		return
	}
	now := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ok, err := s.o.Store.Disconnected(ctx, ac.uid, ac.connID, now); err != nil {
		s.log.Warn("recording a disconnect failed; the offline sweeper will catch it", "agent", ac.uid, "error", err)
	} else if ok {
		s.ev.add(ac.uid, now, store.EventDisconnected, "")
	}
}

// UID formats an instance uid: the canonical UUID form for 16 bytes.
func UID(b []byte) string {
	if len(b) == 16 {
		h := hex.EncodeToString(b)
		return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
	}
	return hex.EncodeToString(b)
}

// ParseUID is the inverse of UID.
func ParseUID(s string) ([]byte, error) {
	return hex.DecodeString(strings.ReplaceAll(s, "-", ""))
}

func (s *Server) onMessage(ctx context.Context, c types.Connection, msg *protobufs.AgentToServer) *protobufs.ServerToAgent {
	s.mMessages.Inc()
	now := time.Now()
	uid := UID(msg.InstanceUid)
	resp := &protobufs.ServerToAgent{InstanceUid: msg.InstanceUid,
		Capabilities: uint64(protobufs.ServerCapabilities_ServerCapabilities_AcceptsStatus |
			protobufs.ServerCapabilities_ServerCapabilities_OffersRemoteConfig |
			protobufs.ServerCapabilities_ServerCapabilities_AcceptsEffectiveConfig |
			protobufs.ServerCapabilities_ServerCapabilities_AcceptsPackagesStatus |
			protobufs.ServerCapabilities_ServerCapabilities_OffersPackages)}
	s.mu.Lock()
	ac := s.conns[c]
	s.mu.Unlock()
	if ac == nil || len(msg.InstanceUid) == 0 {
		return resp
	}
	prev := time.Unix(0, ac.lastMsg.Swap(now.UnixNano()))
	if ac.auth.uid != "" && uid != ac.auth.uid {
		// A credential speaks for its own UID only.
		s.mRejected.Inc()
		s.log.Warn("an agent credential was used for another instance UID; closing the connection", "credential_of", ac.auth.uid, "claimed", uid)
		return s.refuseMessage(ac, msg)
	}
	if why := s.o.Limits.check(msg); why != "" {
		// Nothing of the message is stored; the connection stays, so
		// that an agent that trims its report is served again.
		s.mReports.Inc()
		s.mRejected.Inc()
		if n, ok := s.storm.hit("report "+uid, now); ok {
			s.log.Warn("refused an agent report over a limit", "agent", uid, "limit", why, "transport", transport(ac), "source", ac.auth.source, "count", n)
			s.ev.add(uid, now, store.EventReportRefused, countDetail(why, n))
		}
		resp.ErrorResponse = &protobufs.ServerErrorResponse{Type: protobufs.ServerErrorResponseType_ServerErrorResponseType_BadRequest,
			ErrorMessage: "report refused: " + why}
		return resp
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if ac.ws {
		return s.onWSMessage(ctx, ac, uid, msg, resp, now, prev)
	}
	return s.onHTTPMessage(ctx, ac, uid, msg, resp, now)
}

func (s *Server) onWSMessage(ctx context.Context, ac *agentConn, uid string, msg *protobufs.AgentToServer, resp *protobufs.ServerToAgent, now, prev time.Time) *protobufs.ServerToAgent {
	ac.mu.Lock()
	defer ac.mu.Unlock()
	first := ac.uid == ""
	if first {
		var ok bool
		if uid, ok = s.admit(ctx, ac, uid, msg, resp); !ok {
			return s.refuseMessage(ac, msg)
		}
		if _, err := s.o.Store.Connected(ctx, uid, s.o.ReplicaID, ac.connID, now); err != nil {
			s.log.Warn("recording a connect failed; closing the connection so that the agent retries", "agent", uid, "error", err)
			_ = ac.conn.Disconnect()
			return nil
		}
		ac.uid = uid
		s.mu.Lock()
		if old := s.byUID[uid]; old != nil && old != ac {
			// The same agent connected again before its old connection closed.
			go func() { _ = old.conn.Disconnect() }()
		}
		s.byUID[uid] = ac
		s.mu.Unlock()
		s.ev.add(uid, now, store.EventConnected, "")
		if msg.AgentDescription == nil {
			resp.Flags |= uint64(protobufs.ServerToAgentFlags_ServerToAgentFlags_ReportFullState)
		}
		resp.PackagesAvailable = s.packagesFor(ctx, ac, uid)
		s.ownMetricsOffer(ac, msg.Capabilities, resp)
	} else if uid != ac.uid {
		return resp
	} else if isHeartbeat(msg) {
		ac.hb = heartbeatSeconds(prev, now)
		s.pendingOffer(ctx, ac, uid, resp)
	} else if ac.pending != 0 {
		ac.maxGap = max(ac.maxGap, now.Sub(prev))
		if now.Sub(ac.pendingSince) >= s.o.LearnHeartbeatWithin {
			ac.hb = heartbeatSeconds(now.Add(-ac.maxGap), now)
			s.log.Info("an agent sent no heartbeat to learn its interval from; offering its credential with the longest gap between its messages",
				"agent", uid, "heartbeat_interval_s", ac.hb)
			s.pendingOffer(ctx, ac, uid, resp)
		}
	}
	s.o.Batcher.Touch(uid, ac.connID, now)
	wasKnown := ac.seen.known
	st := s.state(uid, msg, now, &ac.seen)
	if err := s.o.Store.UpdateState(ctx, uid, ac.connID, st); err != nil {
		s.log.Warn("storing agent state failed", "agent", uid, "error", err)
	}
	if ac.seen.known && !wasKnown {
		// Now that the agent told which config it runs.
		s.configs.afterFullState(ctx, ac, uid, resp, now)
	}
	return resp
}

// httpReconnectGap is the pause between two polls of a plain-HTTP agent
// after which its next poll here counts as a (re)connect: it may have been
// marked offline or polled another replica meanwhile.
const httpReconnectGap = time.Minute

func (s *Server) onHTTPMessage(ctx context.Context, ac *agentConn, uid string, msg *protobufs.AgentToServer, resp *protobufs.ServerToAgent, now time.Time) *protobufs.ServerToAgent {
	s.mu.Lock()
	ha := s.http[uid]
	first := ha == nil
	if first {
		ha = &httpAgent{dirty: true, cmdCheck: true, pkgCheck: true}
		ha.seen.Store(now.UnixNano())
		s.http[uid] = ha
	}
	s.mu.Unlock()
	ha.mu.Lock()
	defer ha.mu.Unlock()
	secret := ac.auth.uid == ""
	if !secret {
		ha.byCred = true
	}
	// A poll with the secret is admitted on the first poll here, and
	// again whenever the agent known here polls with a credential: then
	// the secret is someone else claiming its UID (issue 21, item 1).
	if first || secret && ha.byCred {
		forget := func() {
			if first {
				s.mu.Lock()
				delete(s.http, uid)
				s.mu.Unlock()
			}
		}
		got, ok := s.admit(ctx, ac, uid, msg, resp)
		if !ok {
			forget()
			if resp.ErrorResponse != nil {
				return resp
			}
			return s.refuseMessage(ac, msg)
		}
		if got != uid {
			// A duplicate: told to take a new UID, and nothing it sent is
			// stored under the old one. Its next poll, with the new UID,
			// enrolls it.
			forget()
			return resp
		}
	}
	prev := time.Unix(0, ha.seen.Swap(now.UnixNano()))
	if first || now.Sub(prev) > httpReconnectGap {
		connect, err := s.o.Store.ConnectedHTTP(ctx, uid, s.o.ReplicaID, HTTPConnID, now)
		if err != nil {
			if first {
				s.mu.Lock()
				delete(s.http, uid)
				s.mu.Unlock()
			}
			return resp
		}
		if connect {
			s.ev.add(uid, now, store.EventConnected, "plain HTTP")
		}
		if first && msg.AgentDescription == nil {
			resp.Flags |= uint64(protobufs.ServerToAgentFlags_ServerToAgentFlags_ReportFullState)
		}
		if first {
			s.ownMetricsOffer(ac, msg.Capabilities, resp)
		}
	}
	s.o.Batcher.TouchOn(uid, HTTPConnID, s.o.ReplicaID, now)
	st := s.state(uid, msg, now, &ha.rep)
	if err := s.o.Store.UpdateState(ctx, uid, HTTPConnID, st); err != nil {
		s.log.Warn("storing agent state failed", "agent", uid, "error", err)
	}
	if !ha.rep.known {
		// Wait for the full state (see reported.known).
		return resp
	}
	if cmd := s.cmds.forPoll(ctx, uid, ha); cmd != nil {
		// A command travels alone: an agent ignores the other fields of a
		// message that carries one.
		resp.Command = cmd
		return resp
	}
	resp.PackagesAvailable = s.httpPackages(ctx, uid, ha, msg)
	s.configs.forPoll(ctx, uid, ha, resp, now)
	return resp
}
