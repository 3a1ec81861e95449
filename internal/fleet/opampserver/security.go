package opampserver

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"

	"github.com/myriarch/myriarch/internal/fleet/authlimit"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// Agent identity
//
// The enrollment secret only enrolls. On its first message over a
// connection made with the secret, an agent that accepts OpAMP connection
// settings is offered its own credential (ConnectionSettingsOffers, an
// Authorization header), bound to its instance UID and stored hashed.
// A connection made with a credential may speak only for that UID. An
// agent is revoked one by one (store.RevokeAgent): its credential stops
// working, it cannot enroll again (until an admin allows one re-enrollment,
// store.AllowReenroll), and the replica it is connected to
// closes its connection when the notification arrives.
//
// Duplicate UIDs (a cloned VM, a copied state directory): a second
// connection of a UID that is connected here over WebSocket and alive is
// refused before the upgrade when it presents a credential, on either
// transport (409 with Retry-After, so the client backs off), and is told
// to take a new instance UID (AgentIdentification.new_instance_uid) when
// it enrolls with the secret, on either transport (see admit for the
// whole rule); on top, each UID may open only ReconnectsPerMinute
// WebSocket connections per minute here. The old behaviour, the newcomer closing the old
// connection, made two agents with one UID kick each other off hundreds
// of times a second.

// connAuth is how a connection authenticated.
type connAuth struct {
	// uid is the instance UID of the credential; empty for the secret.
	uid string
	// endpoint is the URL the agent connected to, repeated in the offer.
	endpoint string
	// cert is set when a client certificate authenticated the connection
	// (no credential is offered then: the certificate is the identity).
	cert bool
	// source is the client address (authlimit.Source).
	source string
	// token is the credential presented (repeated in the own-metrics
	// offer; telemetry_offer.go).
	token string
}

// authenticate checks the bearer token of r: the enrollment secret or an
// agent credential. code is 0 when accepted, 401 when refused, 503 when
// the check failed (the cause is logged, not sent).
func (s *Server) authenticate(r *http.Request) (connAuth, int) {
	a := connAuth{endpoint: endpoint(r), source: authlimit.Source(r)}
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		// Mutual TLS: the handshake verified the certificate against
		// server.opampClientCaFile; it names the UID it speaks for.
		return s.certAuth(r, a)
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return a, http.StatusUnauthorized
	}
	if subtle.ConstantTimeCompare([]byte(tok), []byte(s.o.Secret)) == 1 {
		return a, 0
	}
	if !strings.HasPrefix(tok, store.CredentialPrefix) {
		return a, http.StatusUnauthorized
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	uid, ok, err := s.o.Store.CheckAgentCredential(ctx, tok)
	if err != nil {
		s.log.Warn("checking an agent credential failed", "error", err)
		return a, http.StatusServiceUnavailable
	}
	if !ok {
		return a, http.StatusUnauthorized
	}
	a.uid, a.token = uid, tok
	return a, 0
}

// certAuth authenticates a verified client certificate: its subject
// common name, or a urn:uuid: URI name, is the instance UID; a revoked
// UID is refused like a revoked credential.
func (s *Server) certAuth(r *http.Request, a connAuth) (connAuth, int) {
	uid := CertUID(r.TLS.VerifiedChains[0][0])
	if uid == "" {
		return a, http.StatusUnauthorized
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	c, known, err := s.o.Store.AgentCredentialOf(ctx, uid)
	if err != nil {
		s.log.Warn("checking an agent's revocation failed", "error", err)
		return a, http.StatusServiceUnavailable
	}
	if known && c.RevokedAt != nil {
		return a, http.StatusUnauthorized
	}
	a.uid, a.cert = uid, true
	return a, 0
}

// CertUID is the instance UID a client certificate names: a URI name
// urn:uuid:<uid>, else the subject common name, in the canonical form of
// UID; "" when neither parses as one.
func CertUID(c *x509.Certificate) string {
	for _, u := range c.URIs {
		if u.Scheme == "urn" && strings.HasPrefix(strings.ToLower(u.Opaque), "uuid:") {
			if b, err := ParseUID(u.Opaque[5:]); err == nil && len(b) == 16 {
				return UID(b)
			}
		}
	}
	if b, err := ParseUID(c.Subject.CommonName); err == nil && len(b) == 16 {
		return UID(b)
	}
	return ""
}

func endpoint(r *http.Request) string {
	scheme := "ws"
	if r.Header.Get("Upgrade") == "" {
		scheme = "http"
	}
	if r.TLS != nil {
		scheme += "s"
	}
	return scheme + "://" + r.Host + r.URL.Path
}

// liveConn is the WebSocket connection of uid here that sent a message
// within OfflineAfter, or nil. A silent one (a half-open TCP connection of
// an agent that restarted) may be replaced.
func (s *Server) liveConn(uid string) *agentConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	ac := s.byUID[uid]
	if ac == nil || time.Since(time.Unix(0, ac.lastMsg.Load())) > s.o.OfflineAfter {
		return nil
	}
	return ac
}

// admit decides the first message of a connection made for uid and
// returns the UID the connection speaks for (a new one for a duplicate
// that enrolls), or ok false to refuse it. It adds the credential offer
// and new UID to resp.
//
// The rules for the enrollment secret, the same on both transports
// (issue 21, item 1):
//   - it never re-issues a credential for a UID that holds one: a UID that
//     is connected (here, or online on another replica) or holds a
//     credential is a duplicate and is told to take a new instance UID
//     (AgentIdentification.new_instance_uid); nothing it sent is stored
//     under the old UID;
//   - an offline agent that holds a credential enrolls again only after an
//     admin allowed it (store.AllowReenroll: API, CLI, UI); the allowance
//     is used up by that enrollment;
//   - a revoked agent is refused;
//   - a new UID (no agent row) counts against server.enrollmentsPerMinute.
//
// Every refusal, issue and rotation is an agent event and a log line; a
// refusal that repeats is logged once per Options.StormLogInterval with a
// count (stormLog).
func (s *Server) admit(ctx context.Context, ac *agentConn, uid string, msg *protobufs.AgentToServer, resp *protobufs.ServerToAgent) (string, bool) {
	if ac.auth.uid != "" {
		return uid, true // checked by authenticate and onConnecting
	}
	now := time.Now()
	if ac.ws && !s.reconnects.Allow(uid) {
		// Before any query: a UID that reconnects in a loop costs a
		// close, not database work.
		s.refuseSecret(ac, uid, "reconnects too often", fmt.Sprintf("more than agents.reconnectsPerMinute (%d)", s.o.ReconnectsPerMinute), now)
		return "", false
	}
	c, known, err := s.o.Store.AgentCredentialOf(ctx, uid)
	if err != nil {
		s.log.Warn("loading an agent credential failed; closing the connection so that the agent retries", "agent", uid, "error", err)
		return "", false
	}
	if known && c.RevokedAt != nil {
		s.refuseSecret(ac, uid, "revoked", "revoked by "+c.RevokedBy, now)
		return "", false
	}
	reason := ""
	if old := s.liveConn(uid); old != nil && old != ac {
		reason = "it is connected to this replica over WebSocket"
	}
	isNew := false
	if reason == "" {
		ag, err := s.o.Store.GetAgent(ctx, uid)
		switch {
		case errors.Is(err, store.ErrNotFound):
			isNew = !known
		case err != nil:
			s.log.Warn("loading an agent failed; closing the connection so that the agent retries", "agent", uid, "error", err)
			return "", false
		case known && c.Issued && ag.Status == "online" && time.Since(ag.LastSeen) < s.o.OfflineAfter:
			reason = "it is online on replica " + ag.ReplicaID
		}
	}
	if reason == "" && known && c.Issued && c.ReenrollAllowedAt == nil {
		reason = "it holds a credential (an admin may allow re-enrollment: myriarchd agent allow-reenroll)"
	}
	if isNew {
		if !s.enrollments.Allow("") {
			s.mEnroll.WithLabelValues("rate_limited").Inc()
			s.refuseSecret(ac, uid, "enrollment rate limit", fmt.Sprintf("server.enrollmentsPerMinute (%d) reached on this replica", s.o.EnrollmentsPerMinute), now)
			if !ac.ws {
				resp.ErrorResponse = &protobufs.ServerErrorResponse{Type: protobufs.ServerErrorResponseType_ServerErrorResponseType_Unavailable,
					ErrorMessage: fmt.Sprintf("enrollment refused: server.enrollmentsPerMinute (%d) reached; retry later", s.o.EnrollmentsPerMinute),
					Details:      &protobufs.ServerErrorResponse_RetryInfo{RetryInfo: &protobufs.RetryInfo{RetryAfterNanoseconds: uint64(s.o.SecretBackoff)}}}
			}
			return "", false
		}
		s.mEnroll.WithLabelValues("accepted").Inc()
	}
	if reason != "" {
		var nb [16]byte
		_, _ = rand.Read(nb[:])
		nb[6] = (nb[6] & 0x0f) | 0x40
		nb[8] = (nb[8] & 0x3f) | 0x80
		newUID := UID(nb[:])
		s.mRejected.Inc()
		detail := fmt.Sprintf("enrollment with the secret over %s from %s refused: %s; told to take instance UID %s", transport(ac), ac.auth.source, reason, newUID)
		if n, ok := s.storm.hit("dup "+uid, now); ok {
			s.log.Warn("an agent enrolled with the instance UID of an enrolled agent; it is given a new instance UID",
				"uid", uid, "new_uid", newUID, "reason", reason, "transport", transport(ac), "source", ac.auth.source, "count", n)
			s.ev.add(uid, now, store.EventEnrollRefused, countDetail(detail, n))
		}
		resp.AgentIdentification = &protobufs.AgentIdentification{NewInstanceUid: nb[:]}
		resp.InstanceUid = nb[:]
		return newUID, true
	}
	if msg.Capabilities&uint64(protobufs.AgentCapabilities_AgentCapabilities_AcceptsOpAMPConnectionSettings) != 0 {
		if s.needsLearnedHeartbeat(ac, msg.Capabilities) {
			// Offered with the agent's own heartbeat interval, learnt
			// from its first heartbeat (see heartbeatSeconds).
			ac.pending, ac.pendingSince = pendingEnroll, time.Now()
			return uid, true
		}
		if !s.enrollOffer(ctx, ac, uid, msg.Capabilities, 0, resp) {
			return "", false
		}
	}
	return uid, true
}

// transport names the transport of ac for logs and events.
func transport(ac *agentConn) string {
	if ac.ws {
		return "WebSocket"
	}
	return "plain HTTP"
}

func countDetail(detail string, n int) string {
	if n > 1 {
		return fmt.Sprintf("%s (%d times since the last such event)", detail, n)
	}
	return detail
}

// refuseSecret records the refusal of a connection made with the secret
// for uid (a log line and an event, once per storm interval) and puts its
// source into backoff, so that its next connections are refused before
// the upgrade (see sourceBackoff).
func (s *Server) refuseSecret(ac *agentConn, uid, what, detail string, now time.Time) {
	s.mRejected.Inc()
	s.backoff.add(ac.auth.source, now, s.o.SecretBackoff)
	if n, ok := s.storm.hit(what+" "+uid, now); ok {
		s.log.Warn("refused an enrollment with the secret; its source waits before its next try", "agent", uid, "reason", what, "detail", detail,
			"transport", transport(ac), "source", ac.auth.source, "backoff_s", s.o.SecretBackoff.Seconds(), "count", n)
		s.ev.add(uid, now, store.EventEnrollRefused,
			countDetail(fmt.Sprintf("enrollment with the secret over %s from %s refused: %s (%s)", transport(ac), ac.auth.source, what, detail), n))
	}
}

// enrollOffer issues uid its credential on enrollment with the secret and
// puts the offer into resp. false when uid turned out revoked.
func (s *Server) enrollOffer(ctx context.Context, ac *agentConn, uid string, caps uint64, hb uint64, resp *protobufs.ServerToAgent) bool {
	cred, re, err := s.o.Store.EnrollAgentCredential(ctx, uid)
	switch {
	case errors.Is(err, store.ErrRevoked):
		s.refuseSecret(ac, uid, "revoked", "revoked while enrolling", time.Now())
		return false
	case errors.Is(err, store.ErrCredentialHeld):
		// Another replica enrolled this UID a moment ago.
		s.log.Warn("an agent credential was issued elsewhere while this agent enrolled; no credential offered", "agent", uid)
		return true
	case err != nil:
		s.log.Warn("issuing an agent credential failed; the agent keeps enrolling with the secret", "agent", uid, "error", err)
		return true
	}
	how := "enrollment"
	if re {
		how = "re-enrollment allowed by an admin"
	}
	s.log.Info("issued an agent credential", "agent", uid, "how", how, "transport", transport(ac), "source", ac.auth.source)
	s.ev.add(uid, time.Now(), store.EventCredentialIssued, fmt.Sprintf("%s over %s from %s", how, transport(ac), ac.auth.source))
	resp.ConnectionSettings = s.offer(cred, ac.auth.endpoint, caps, ac.ws, hb)
	resp.Capabilities |= uint64(protobufs.ServerCapabilities_ServerCapabilities_OffersConnectionSettings)
	return true
}

// Heartbeat interval of a credential offer (issue 21, item 10)
//
// opamp-go applies the heartbeat interval of every connection settings
// offer to an agent that reports heartbeats (client/internal/
// receivedprocessor.go, rcvOpampConnectionSettings), before the agent
// sees the offer: over WebSocket 0 turns its heartbeats off, over plain
// HTTP a positive value becomes its poll interval (0 is refused there and
// changes nothing). So the offer decides the agent's heartbeat whatever
// the agent was configured with. The agent's own setting wins unless
// server.opampHeartbeatInterval is set: then that is offered to every
// agent (and becomes the poll interval of plain-HTTP agents). Unset, a
// WebSocket agent that reports heartbeats is offered its own interval,
// learnt from the gap before its first heartbeat on the connection (its
// credential comes with that heartbeat, up to one interval after it
// connected); a plain-HTTP agent is offered 0.

const (
	pendingEnroll = 1 // a credential to issue on the first heartbeat
	pendingRotate = 2 // a rotated credential to send on the first heartbeat
)

// needsLearnedHeartbeat reports whether an offer to ac must wait for the
// agent's heartbeat interval.
func (s *Server) needsLearnedHeartbeat(ac *agentConn, caps uint64) bool {
	return ac.ws && s.o.HeartbeatInterval == 0 && ac.hb == 0 &&
		caps&uint64(protobufs.AgentCapabilities_AgentCapabilities_ReportsHeartbeat) != 0
}

// heartbeatSeconds is the interval the heartbeat that arrived at now
// shows, prev being the agent's previous message: whole seconds, at
// least 1.
func heartbeatSeconds(prev, now time.Time) uint64 {
	return uint64(max(1, math.Round(now.Sub(prev).Seconds())))
}

// offer wraps credential cred as the OpAMP connection settings the agent
// uses from its next connection on; hb is the learnt heartbeat interval
// in seconds (see above).
func (s *Server) offer(cred, endpoint string, caps uint64, ws bool, hb uint64) *protobufs.ConnectionSettingsOffers {
	o := &protobufs.OpAMPConnectionSettings{DestinationEndpoint: endpoint,
		Headers: &protobufs.Headers{Headers: []*protobufs.Header{{Key: "Authorization", Value: "Bearer " + cred}}}}
	switch {
	case s.o.HeartbeatInterval > 0:
		o.HeartbeatIntervalSeconds = uint64(s.o.HeartbeatInterval / time.Second)
	case ws && caps&uint64(protobufs.AgentCapabilities_AgentCapabilities_ReportsHeartbeat) != 0:
		o.HeartbeatIntervalSeconds = hb
	}
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	return &protobufs.ConnectionSettingsOffers{Hash: nonce[:], Opamp: o, OwnMetrics: s.ownMetricsSettings(cred, endpoint, caps)}
}

// revoke closes the connection of a revoked agent here and forgets it as
// a plain-HTTP agent (its next poll is checked afresh).
func (s *Server) revoke(uid string) {
	s.mu.Lock()
	ac := s.byUID[uid]
	delete(s.http, uid)
	s.mu.Unlock()
	if ac != nil {
		s.log.Info("closing the connection of a revoked agent", "agent", uid)
		_ = ac.conn.Disconnect()
	}
}

// rotate sends agent uid a new credential if it is connected here (on its
// next heartbeat when its interval is not known yet).
func (s *Server) rotate(ctx context.Context, uid string) {
	ac := s.wsConn(uid)
	if ac == nil {
		return
	}
	ac.mu.Lock()
	defer ac.mu.Unlock()
	if ac.seen.caps&uint64(protobufs.AgentCapabilities_AgentCapabilities_AcceptsOpAMPConnectionSettings) == 0 {
		return
	}
	if s.needsLearnedHeartbeat(ac, ac.seen.caps) {
		ac.pending, ac.pendingSince = pendingRotate, time.Now()
		return
	}
	offer, err := s.rotateOffer(ctx, ac, uid)
	if err != nil {
		s.log.Warn("rotating an agent credential failed", "agent", uid, "error", err)
		return
	}
	msg := &protobufs.ServerToAgent{ConnectionSettings: offer,
		Capabilities: uint64(protobufs.ServerCapabilities_ServerCapabilities_OffersConnectionSettings)}
	if err := ac.send(ctx, msg); err != nil {
		s.log.Warn("sending a rotated credential failed", "agent", uid, "error", err)
	}
}

// rotateOffer issues uid a new credential (replacing its current one) and
// records it.
func (s *Server) rotateOffer(ctx context.Context, ac *agentConn, uid string) (*protobufs.ConnectionSettingsOffers, error) {
	cred, err := s.o.Store.IssueAgentCredential(ctx, uid)
	if err != nil {
		return nil, err
	}
	s.log.Info("agent credential rotated", "agent", uid)
	s.ev.add(uid, time.Now(), store.EventCredentialRotated, "")
	return s.offer(cred, ac.auth.endpoint, ac.seen.caps, ac.ws, ac.hb), nil
}

// pendingOffer puts the credential offer that waited for the agent's
// heartbeat interval (needsLearnedHeartbeat) into resp.
func (s *Server) pendingOffer(ctx context.Context, ac *agentConn, uid string, resp *protobufs.ServerToAgent) {
	switch ac.pending {
	case pendingEnroll:
		ac.pending = 0
		s.enrollOffer(ctx, ac, uid, ac.seen.caps, ac.hb, resp)
	case pendingRotate:
		ac.pending = 0
		offer, err := s.rotateOffer(ctx, ac, uid)
		if err != nil {
			s.log.Warn("rotating an agent credential failed", "agent", uid, "error", err)
			return
		}
		resp.ConnectionSettings = offer
		resp.Capabilities |= uint64(protobufs.ServerCapabilities_ServerCapabilities_OffersConnectionSettings)
	}
}

// reconcileIdentity acts on the revocations and rotations of the agents
// uids whose notification was lost.
func (s *Server) reconcileIdentity(ctx context.Context, uids []string) error {
	rev, err := s.o.Store.RevokedAmong(ctx, uids)
	if err != nil {
		return err
	}
	for uid := range rev {
		s.revoke(uid)
	}
	rot, err := s.o.Store.PendingRotations(ctx, uids)
	if err != nil {
		return err
	}
	for uid := range rot {
		s.rotate(ctx, uid)
	}
	return nil
}

// refuseMessage ends a connection whose message is refused (a credential
// used for another UID, a revoked agent): a WebSocket is closed; a
// plain-HTTP poll, which has nothing to close, is answered with an error.
func (s *Server) refuseMessage(ac *agentConn, msg *protobufs.AgentToServer) *protobufs.ServerToAgent {
	if ac.ws {
		_ = ac.conn.Disconnect()
		return nil
	}
	return &protobufs.ServerToAgent{InstanceUid: msg.InstanceUid, ErrorResponse: &protobufs.ServerErrorResponse{
		Type: protobufs.ServerErrorResponseType_ServerErrorResponseType_BadRequest, ErrorMessage: "refused: revoked, or a credential of another instance UID"}}
}
