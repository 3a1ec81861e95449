package opampserver

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"net/url"
	"strings"

	"github.com/open-telemetry/opamp-go/protobufs"
)

// Own metrics (issue 27)
//
// An agent that reports its own metrics (AgentCapabilities ReportsOwnMetrics)
// and holds a credential is offered a destination for them
// (ConnectionSettingsOffers.own_metrics): the OTLP/HTTP metrics endpoint
// of this listener (OwnMetricsPath, /v1/metrics) at the address the agent
// used for OpAMP (or Options.OwnMetricsURL, telemetry.publicUrl), with an
// Authorization header carrying the agent's own credential. It is offered
// with a new credential (enrollment, rotation: offer) and on the first
// message of every connection made with a credential (ownMetricsOffer).
// An agent authenticated by a client certificate is not offered one (its
// OTLP exporter would need the certificate; not yet).
//
// The endpoint is behind the listener's body guard like plain-HTTP OpAMP:
// the credential is checked from the headers before a byte of the body is
// read (the enrollment secret is refused before the guard), the body is
// bounded by server.opampMaxMessageBytes (after gzip) and read under the
// same deadline and budgets. The sink stores what it carries under the
// credential's UID only.

// OwnMetricsSink stores the own metrics of an authenticated agent
// (telemetry.Receiver).
type OwnMetricsSink interface {
	ServeAgent(w http.ResponseWriter, r *http.Request, uid string)
}

// DefaultOwnMetricsPath is the path of the OTLP/HTTP metrics endpoint.
const DefaultOwnMetricsPath = "/v1/metrics"

// ownMetricsHandler serves the OTLP/HTTP metrics endpoint behind the guard.
func (s *Server) ownMetricsHandler() http.Handler {
	guarded := s.guard.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, code, retry, _ := s.authOf(r)
		if code == 0 && a.uid == "" {
			code = http.StatusUnauthorized
		}
		if code != 0 {
			s.guard.refuse(w, code, retry, "unauthenticated", http.StatusText(code))
			return
		}
		s.o.OwnMetrics.ServeAgent(w, r, a.uid)
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "" {
			http.Error(w, "the OTLP/HTTP metrics endpoint takes POST, not a WebSocket", http.StatusBadRequest)
			return
		}
		// The enrollment secret enrolls; it does not speak for an agent.
		// Refused before the guard reads the body.
		if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok &&
			subtle.ConstantTimeCompare([]byte(tok), []byte(s.o.Secret)) == 1 {
			s.guard.refuse(w, http.StatusUnauthorized, "", "unauthenticated", "the enrollment secret does not authenticate own metrics; use the agent's credential")
			return
		}
		guarded.ServeHTTP(w, r)
	})
}

// ownMetricsURL is the destination offered to an agent that connected to
// endpoint (ws[s]:// or http[s]://host/path).
func (s *Server) ownMetricsURL(endpoint string) string {
	if s.o.OwnMetricsURL != "" {
		return s.o.OwnMetricsURL
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return ""
	}
	switch u.Scheme {
	case "ws":
		u.Scheme = "http"
	case "wss":
		u.Scheme = "https"
	}
	u.Path = s.ownMetricsPath()
	return u.String()
}

func (s *Server) ownMetricsPath() string {
	if s.o.OwnMetricsPath != "" {
		return s.o.OwnMetricsPath
	}
	return DefaultOwnMetricsPath
}

// ownMetricsSettings is the own_metrics offer for an agent holding cred
// that connected to endpoint with capabilities caps; nil when the agent
// does not report its own metrics or the endpoint is off.
func (s *Server) ownMetricsSettings(cred, endpoint string, caps uint64) *protobufs.TelemetryConnectionSettings {
	if s.o.OwnMetrics == nil || cred == "" || caps&uint64(protobufs.AgentCapabilities_AgentCapabilities_ReportsOwnMetrics) == 0 {
		return nil
	}
	dest := s.ownMetricsURL(endpoint)
	if dest == "" {
		return nil
	}
	return &protobufs.TelemetryConnectionSettings{DestinationEndpoint: dest,
		Headers: &protobufs.Headers{Headers: []*protobufs.Header{{Key: "Authorization", Value: "Bearer " + cred}}}}
}

// ownMetricsOffer puts the own_metrics offer into resp on the first
// message of a connection made with a credential (unless resp already
// carries an offer). Its hash is that of the settings, so that an agent
// that has them applies nothing new.
func (s *Server) ownMetricsOffer(ac *agentConn, caps uint64, resp *protobufs.ServerToAgent) {
	if resp.ConnectionSettings != nil || ac.auth.cert {
		return
	}
	om := s.ownMetricsSettings(ac.auth.token, ac.auth.endpoint, caps)
	if om == nil {
		return
	}
	h := sha256.Sum256([]byte(om.DestinationEndpoint + "\n" + om.Headers.Headers[0].Value))
	resp.ConnectionSettings = &protobufs.ConnectionSettingsOffers{Hash: h[:], OwnMetrics: om}
	resp.Capabilities |= uint64(protobufs.ServerCapabilities_ServerCapabilities_OffersConnectionSettings)
}
