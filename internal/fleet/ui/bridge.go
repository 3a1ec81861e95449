package ui

import (
	"encoding/json"
	"sort"
	"strings"
)

// bridgeSession is one session of a myriarch-bridge, from the health
// component "session/<id>" that the bridge reports: its status is
// space-separated key=value pairs (internal/bridge/opamp.SessionStatusText).
type bridgeSession struct {
	ID      string
	Healthy bool
	Error   string
	F       map[string]string // role, service_level, lease_version, ...
}

// bridgeSessions returns the sessions of a bridge's health report, sorted
// by ID; none for other agents.
func bridgeSessions(raw json.RawMessage) []bridgeSession {
	var n healthJSON
	if len(raw) == 0 || json.Unmarshal(raw, &n) != nil {
		return nil
	}
	var out []bridgeSession
	for name, c := range n.Components {
		id, ok := strings.CutPrefix(name, "session/")
		if !ok || c == nil {
			continue
		}
		s := bridgeSession{ID: id, Healthy: c.Healthy, Error: c.LastError, F: map[string]string{}}
		for f := range strings.FieldsSeq(c.Status) {
			if k, v, ok := strings.Cut(f, "="); ok {
				s.F[k] = v
			}
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
