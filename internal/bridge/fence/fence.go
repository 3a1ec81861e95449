// Package fence names what an exclusive session stamps on every message it
// delivers, so that a destination can tell which owner sent it: the lease
// version (the fencing token: a decimal uint64 that grows with every grant
// of the lease) and the session id (the lease's session, "bridge_id/session_id",
// the scope in which versions grow). Messages of non-exclusive sessions
// carry neither.
//
// Where the stamp travels:
//
//	MQTT 5 sender     user properties  myriarch-lease-version, myriarch-session-id
//	HTTP sender       headers          Myriarch-Lease-Version, Myriarch-Session-Id
//	Kafka, NATS       record headers   Myriarch-Lease-Version, Myriarch-Session-Id
//	AMQP sender       headers          Myriarch-Lease-Version, Myriarch-Session-Id
//	SQS sender        attributes       Myriarch-Lease-Version, Myriarch-Session-Id
//	file sender       JSON line fields "lease_version" (number), "session_id" (string)
//
// # Consumer recipe: discarding a stale owner's output
//
// The bridge stops acting at its local lease deadline, checked right before
// every intake, hand-off, send and acknowledgment, so a deposed owner does
// not start new deliveries. A delivery it had already started when its lease
// ended (a PUBLISH on the wire, an HTTP request in flight) can still arrive
// after the successor's first. A destination that must never apply such a
// message keeps, per session id, the highest lease version it has seen:
//
//	v := stamp.LeaseVersion
//	if v < highest[stamp.SessionID] { discard: a deposed owner sent it }
//	else { highest[stamp.SessionID] = v; apply }
//
// Messages with the same version come from one tenure and keep their
// per-topic order. A message without a stamp comes from a non-exclusive
// session and is not fenced.
package fence

import (
	"net/http"
	"strconv"
)

// The names of the stamp, fixed: consumers match on them.
const (
	// MQTTLeaseVersion and MQTTSessionID are MQTT 5 user property names.
	MQTTLeaseVersion = "myriarch-lease-version"
	MQTTSessionID    = "myriarch-session-id"
	// HeaderLeaseVersion and HeaderSessionID are the HTTP, Kafka and NATS
	// header names.
	HeaderLeaseVersion = "Myriarch-Lease-Version"
	HeaderSessionID    = "Myriarch-Session-Id"
	// FieldLeaseVersion and FieldSessionID are the file sender's JSON fields.
	FieldLeaseVersion = "lease_version"
	FieldSessionID    = "session_id"
)

// Stamp is the fencing stamp of one tenure. The zero Stamp (a
// non-exclusive session) stamps nothing.
type Stamp struct {
	// LeaseVersion is the lease version of the tenure (the fencing token).
	LeaseVersion uint64
	// SessionID is the lease's session id.
	SessionID string
	// version is LeaseVersion in decimal, formatted once per tenure.
	version string
}

// New returns the stamp of a tenure.
func New(version uint64, sessionID string) Stamp {
	return Stamp{LeaseVersion: version, SessionID: sessionID, version: strconv.FormatUint(version, 10)}
}

// IsZero reports whether s stamps nothing.
func (s Stamp) IsZero() bool { return s.LeaseVersion == 0 && s.SessionID == "" }

// Version is LeaseVersion in decimal.
func (s Stamp) Version() string {
	if s.version == "" && s.LeaseVersion != 0 {
		return strconv.FormatUint(s.LeaseVersion, 10)
	}
	return s.version
}

// SetHeaders stamps h (HTTP); the zero Stamp leaves it alone.
func (s Stamp) SetHeaders(h http.Header) {
	if s.IsZero() {
		return
	}
	h.Set(HeaderLeaseVersion, s.Version())
	h.Set(HeaderSessionID, s.SessionID)
}

// Parse reads a stamp back from its two string values (headers, user
// properties). It reports false when the version is missing or not a
// decimal uint64.
func Parse(version, sessionID string) (Stamp, bool) {
	v, err := strconv.ParseUint(version, 10, 64)
	if err != nil {
		return Stamp{}, false
	}
	return New(v, sessionID), true
}

// Tenure is what a message's point-of-action check asks: may the owner
// that handed the message over still act? lease.Ownership implements it;
// nil means the work is not under a lease (a non-exclusive session).
type Tenure interface {
	Valid() bool
}
