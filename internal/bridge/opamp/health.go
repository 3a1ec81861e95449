package opamp

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"

	"github.com/myriarch/myriarch/internal/bridge/runtime"
)

// ComponentPrefix names a session's health component: "session/<id>".
const ComponentPrefix = "session/"

// health is the bridge's health: healthy when ready, one component per
// session. A component's status is a space-separated list of key=value
// pairs (see SessionStatusText), which myriarchd's agent page shows as a
// table.
func (c *Client) health() *protobufs.ComponentHealth {
	st := c.o.Bridge.Status()
	now := uint64(time.Now().UnixNano())
	h := &protobufs.ComponentHealth{Healthy: st.Ready, Status: "ready", StatusTimeUnixNano: now,
		ComponentHealthMap: map[string]*protobufs.ComponentHealth{}}
	if !st.Ready {
		h.Status = "not ready"
	}
	for _, s := range st.Sessions {
		ch := &protobufs.ComponentHealth{Healthy: s.Role == "standby" || s.ServiceLevel == "full", Status: SessionStatusText(s),
			StatusTimeUnixNano: uint64(s.ServiceLevelSince.UnixNano())}
		if s.Role == "stepped_down" {
			ch.LastError = "broker-path step-down"
		}
		h.ComponentHealthMap[ComponentPrefix+s.ID] = ch
	}
	return h
}

// SessionStatusText renders a session as key=value pairs: mode, role,
// service_level, lease_version, lease_owner, in_flight, the last
// takeover-to-full and failure-to-full in seconds, the worst-case and
// broker-path failover budgets and the failover objective in seconds.
// Absent values are left out.
func SessionStatusText(s runtime.SessionStatus) string {
	var b strings.Builder
	add := func(k, v string) {
		if v == "" {
			return
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%s", k, v)
	}
	secs := func(p *float64) string {
		if p == nil {
			return ""
		}
		return strconv.FormatFloat(*p, 'f', 3, 64)
	}
	add("mode", s.Mode)
	add("role", s.Role)
	add("service_level", s.ServiceLevel)
	if s.LeaseVersion > 0 {
		add("lease_version", strconv.FormatInt(s.LeaseVersion, 10))
	}
	add("lease_owner", s.LeaseOwner)
	add("in_flight", strconv.FormatInt(s.InFlight, 10))
	if len(s.Spools) > 0 {
		var n int64
		var oldest float64
		for _, sp := range s.Spools {
			n += sp.Messages
			oldest = max(oldest, sp.OldestAgeS)
		}
		add("spool_messages", strconv.FormatInt(n, 10))
		add("spool_oldest_age_s", strconv.FormatFloat(oldest, 'f', 3, 64))
	}
	add("last_takeover_to_full_s", secs(s.TakeoverToFull))
	add("last_failure_to_full_s", secs(s.FailureToFull))
	if r := s.Budget; r != nil {
		add("owner_death_budget_s", secs(r.OwnerDeathBudget))
		add("broker_path_budget_s", secs(r.BrokerPathBudget))
		add("failover_slo_s", secs(r.FailoverSLO))
	}
	return b.String()
}

// ParseStatusText is the inverse of SessionStatusText.
func ParseStatusText(s string) map[string]string {
	out := map[string]string{}
	for f := range strings.FieldsSeq(s) {
		if k, v, ok := strings.Cut(f, "="); ok {
			out[k] = v
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
