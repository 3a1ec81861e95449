package store

import (
	"encoding/json"
	"slices"
	"strings"
)

// BridgeIDAttribute is the non-identifying attribute a myriarch-bridge
// reports its bridge id under; the two processes of a pair share it.
const BridgeIDAttribute = "myriarch.bridge.id"

// Session roles a myriarch-bridge reports per exclusive session.
const (
	RoleOwner   = "owner"
	RoleStandby = "standby"
)

// SessionRoles are the roles a myriarch-bridge reports for a session
// (the bridge's runtime.SessionStatus.Role): owner and standby of an
// exclusive session, active for a non-exclusive one, stopped.
var SessionRoles = []string{RoleOwner, RoleStandby, "active", "stopped"}

// IsSessionRole reports whether r is one of SessionRoles.
func IsSessionRole(r string) bool { return slices.Contains(SessionRoles, r) }

// SQL expressions over the agents table, for filters and orders that must
// run in the database (a page of a large fleet never loads every row):
// BridgeIDSQL is Agent.BridgeID and SessionRolesSQL is Agent.Roles (a
// text[] column that a trigger keeps from the health report with the SQL
// twin of BridgeSessions, migration 00067, which indexes both).
// TestSessionRolesSQLMatchesGo holds the two parsers together.
const (
	BridgeIDSQL     = `(non_identifying->>'` + BridgeIDAttribute + `')`
	SessionRolesSQL = `session_roles`
)

// SessionRoleSQL is the condition "the agent reports a session in role"
// for one of SessionRoles (checked: it panics on another), with the role
// as a constant, the predicate of the role's partial index in uid order.
func SessionRoleSQL(role string) string {
	if !IsSessionRole(role) {
		panic("store: not a session role: " + role)
	}
	return SessionRolesSQL + ` @> '{` + role + `}'`
}

// BridgeSession is one session of a myriarch-bridge, from the health
// component "session/<id>" that the bridge reports: its status is
// space-separated key=value pairs (the bridge's opamp.SessionStatusText).
type BridgeSession struct {
	ID      string            `json:"id"`
	Healthy bool              `json:"healthy"`
	Error   string            `json:"error,omitempty"`
	Role    string            `json:"role,omitempty"`
	Fields  map[string]string `json:"fields,omitempty"` // service_level, lease_version, ...
}

// BridgeID is the bridge id the agent reports; "" for agents that are not
// myriarch-bridge processes.
func (a Agent) BridgeID() string { return a.NonIdentifying[BridgeIDAttribute] }

// BridgeSessions returns the sessions of a bridge's health report, sorted by
// id; none for other agents or an unreadable report.
func (a Agent) BridgeSessions() []BridgeSession { return BridgeSessions(a.Health) }

// Roles returns the distinct session roles the agent reports, sorted
// ("owner", "standby", ...); none for agents without sessions.
func (a Agent) Roles() []string {
	var out []string
	for _, s := range a.BridgeSessions() {
		if s.Role != "" && !slices.Contains(out, s.Role) {
			out = append(out, s.Role)
		}
	}
	slices.Sort(out)
	return out
}

// healthNode is the stored shape of an agent's health (opampserver writes
// it): nested components by name.
type healthNode struct {
	Healthy    bool                   `json:"healthy"`
	Status     string                 `json:"status"`
	LastError  string                 `json:"last_error"`
	Components map[string]*healthNode `json:"components"`
}

// BridgeSessions parses the "session/<id>" components of a stored health
// report.
func BridgeSessions(health json.RawMessage) []BridgeSession {
	var n healthNode
	if len(health) == 0 || json.Unmarshal(health, &n) != nil {
		return nil
	}
	var out []BridgeSession
	for name, c := range n.Components {
		id, ok := strings.CutPrefix(name, "session/")
		if !ok || c == nil {
			continue
		}
		s := BridgeSession{ID: id, Healthy: c.Healthy, Error: c.LastError, Fields: map[string]string{}}
		// ASCII white space and the first of a repeated key, as the SQL
		// twin (migration 00068) reads it: the role filter and the page
		// must not disagree on what an agent reports.
		for f := range strings.FieldsFuncSeq(c.Status, isASCIISpace) {
			if k, v, ok := strings.Cut(f, "="); ok {
				if _, dup := s.Fields[k]; !dup {
					s.Fields[k] = v
				}
			}
		}
		s.Role = s.Fields["role"]
		out = append(out, s)
	}
	slices.SortFunc(out, func(x, y BridgeSession) int { return strings.Compare(x.ID, y.ID) })
	return out
}

// isASCIISpace is the white space of a session status: the SQL twin's
// [ \t\n\r\f\v], not the locale's nor Unicode's.
func isASCIISpace(r rune) bool {
	switch r {
	case ' ', '\t', '\n', '\r', '\f', '\v':
		return true
	}
	return false
}
