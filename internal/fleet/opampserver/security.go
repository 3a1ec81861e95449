package opampserver

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/x509"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"

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
// working, it cannot enroll again, and the replica it is connected to
// closes its connection when the notification arrives.
//
// Duplicate UIDs (a cloned VM, a copied state directory): a second
// connection of a UID that is connected here and alive is refused before
// the upgrade when it presents a credential (409 with Retry-After, so the
// client backs off), and is told to take a new instance UID
// (AgentIdentification.new_instance_uid) when it enrolls with the secret;
// on top, each UID may open only ReconnectsPerMinute connections per
// minute here. The old behaviour, the newcomer closing the old
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
}

// authenticate checks the bearer token of r: the enrollment secret or an
// agent credential. code is 0 when accepted, 401 when refused, 503 when
// the check failed (the cause is logged, not sent).
func (s *Server) authenticate(r *http.Request) (connAuth, int) {
	a := connAuth{endpoint: endpoint(r)}
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
	a.uid = uid
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
// that enrolls), or ok false to close it. It adds the credential offer and
// new UID to resp.
func (s *Server) admit(ctx context.Context, ac *agentConn, uid string, msg *protobufs.AgentToServer, resp *protobufs.ServerToAgent) (string, bool) {
	if ac.auth.uid != "" {
		return uid, true // checked by authenticate and onConnecting
	}
	if ac.ws && !s.reconnects.Allow(uid) {
		// Before any query: a UID that reconnects in a loop costs a
		// close, not database work.
		s.mRejected.Inc()
		s.log.Warn("an agent reconnects too often; closing its connection", "agent", uid, "limit_per_minute", s.o.ReconnectsPerMinute)
		return "", false
	}
	c, known, err := s.o.Store.AgentCredentialOf(ctx, uid)
	if err != nil {
		s.log.Warn("loading an agent credential failed; closing the connection so that the agent retries", "agent", uid, "error", err)
		return "", false
	}
	if known && c.RevokedAt != nil {
		s.mRejected.Inc()
		s.log.Info("refused a revoked agent", "agent", uid)
		return "", false
	}
	dup := false
	if ac.ws {
		if old := s.liveConn(uid); old != nil && old != ac {
			dup = true
		}
	}
	if ac.ws && !dup && known && c.Issued {
		// Enrolled before, and now with the secret: online means another
		// agent holds the UID (or the credential was lost while connected).
		ag, err := s.o.Store.GetAgent(ctx, uid)
		if err == nil && ag.Status == "online" && time.Since(ag.LastSeen) < s.o.OfflineAfter {
			dup = true
		}
	}
	if dup {
		var nb [16]byte
		_, _ = rand.Read(nb[:])
		nb[6] = (nb[6] & 0x0f) | 0x40
		nb[8] = (nb[8] & 0x3f) | 0x80
		newUID := UID(nb[:])
		s.log.Warn("an agent enrolled with the UID of a connected agent; it is given a new instance UID", "uid", uid, "new_uid", newUID)
		resp.AgentIdentification = &protobufs.AgentIdentification{NewInstanceUid: nb[:]}
		resp.InstanceUid = nb[:]
		uid = newUID
	}
	if msg.Capabilities&uint64(protobufs.AgentCapabilities_AgentCapabilities_AcceptsOpAMPConnectionSettings) != 0 {
		offer, err := s.credentialOffer(ctx, uid, ac.auth.endpoint, msg.Capabilities, ac.ws)
		if errors.Is(err, store.ErrRevoked) {
			return "", false
		}
		if err != nil {
			s.log.Warn("issuing an agent credential failed; the agent keeps enrolling with the secret", "agent", uid, "error", err)
		} else {
			resp.ConnectionSettings = offer
			resp.Capabilities |= uint64(protobufs.ServerCapabilities_ServerCapabilities_OffersConnectionSettings)
		}
	}
	return uid, true
}

// credentialOffer issues a new credential of uid and wraps it as the OpAMP
// connection settings the agent uses from its next connection on.
func (s *Server) credentialOffer(ctx context.Context, uid, endpoint string, caps uint64, ws bool) (*protobufs.ConnectionSettingsOffers, error) {
	cred, err := s.o.Store.IssueAgentCredential(ctx, uid)
	if err != nil {
		return nil, err
	}
	o := &protobufs.OpAMPConnectionSettings{DestinationEndpoint: endpoint,
		Headers: &protobufs.Headers{Headers: []*protobufs.Header{{Key: "Authorization", Value: "Bearer " + cred}}}}
	if ws && caps&uint64(protobufs.AgentCapabilities_AgentCapabilities_ReportsHeartbeat) != 0 {
		// opamp-go applies the offer's heartbeat interval too, and 0 would
		// turn a WebSocket agent's heartbeats off: offer the client
		// default. Over plain HTTP it would become the poll interval; 0
		// leaves that alone (opamp-go refuses 0 there).
		o.HeartbeatIntervalSeconds = 30
	}
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	return &protobufs.ConnectionSettingsOffers{Hash: nonce[:], Opamp: o}, nil
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

// rotate sends agent uid a new credential if it is connected here.
func (s *Server) rotate(ctx context.Context, uid string) {
	s.mu.Lock()
	ac := s.byUID[uid]
	s.mu.Unlock()
	if ac == nil {
		return
	}
	ac.mu.Lock()
	defer ac.mu.Unlock()
	if ac.seen.caps&uint64(protobufs.AgentCapabilities_AgentCapabilities_AcceptsOpAMPConnectionSettings) == 0 {
		return
	}
	offer, err := s.credentialOffer(ctx, uid, ac.auth.endpoint, ac.seen.caps, true)
	if err != nil {
		s.log.Warn("rotating an agent credential failed", "agent", uid, "error", err)
		return
	}
	msg := &protobufs.ServerToAgent{ConnectionSettings: offer,
		Capabilities: uint64(protobufs.ServerCapabilities_ServerCapabilities_OffersConnectionSettings)}
	msg.InstanceUid, _ = ParseUID(uid)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := ac.conn.Send(sctx, msg); err != nil {
		s.log.Warn("sending a rotated credential failed", "agent", uid, "error", err)
		return
	}
	s.log.Info("agent credential rotated", "agent", uid)
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
