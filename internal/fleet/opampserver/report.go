package opampserver

import (
	"cmp"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/myriarch/myriarch/internal/fleet/lastseen"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// What agents report: the limits a message must keep, the agent state
// stored from it, and the agent events, which go out in batches through
// the lastseen.Batcher (a heartbeat costs no write of its own).

// events records agent events of this replica.
type events struct {
	batcher *lastseen.Batcher
	replica string
}

// add records an event of kind for agent uid at at.
func (e events) add(uid string, at time.Time, kind, detail string) {
	e.batcher.Event(store.Event{InstanceUID: uid, At: at, Kind: kind, ReplicaID: e.replica, Detail: detail})
}

// ReportLimits bound what an agent may report in one message. A message
// beyond one is refused whole with an error response that names the
// limit; nothing of it is stored. Zero fields take the defaults of
// Options (see New).
type ReportLimits struct {
	// MaxAttributes bounds identifying plus non-identifying attributes.
	MaxAttributes int
	// MaxKeyBytes and MaxValueBytes bound one attribute's key and value.
	MaxKeyBytes   int
	MaxValueBytes int
	// MaxEffectiveConfigBytes bounds the effective config (all files).
	MaxEffectiveConfigBytes int
	// MaxHealthComponents bounds the component health entries, nested
	// ones included.
	MaxHealthComponents int
}

func (l *ReportLimits) defaults() {
	l.MaxAttributes = cmp.Or(l.MaxAttributes, 256)
	l.MaxKeyBytes = cmp.Or(l.MaxKeyBytes, 256)
	l.MaxValueBytes = cmp.Or(l.MaxValueBytes, 4096)
	l.MaxEffectiveConfigBytes = cmp.Or(l.MaxEffectiveConfigBytes, 1<<20)
	l.MaxHealthComponents = cmp.Or(l.MaxHealthComponents, 1000)
}

// check returns "" when msg is within the limits, else the refusal: the
// field, its size and the setting that bounds it.
func (l ReportLimits) check(msg *protobufs.AgentToServer) string {
	if d := msg.AgentDescription; d != nil {
		if n := len(d.IdentifyingAttributes) + len(d.NonIdentifyingAttributes); n > l.MaxAttributes {
			return fmt.Sprintf("agent_description: %d attributes, more than server.agentMaxAttributes (%d)", n, l.MaxAttributes)
		}
		for _, kvs := range [][]*protobufs.KeyValue{d.IdentifyingAttributes, d.NonIdentifyingAttributes} {
			for _, kv := range kvs {
				if len(kv.Key) > l.MaxKeyBytes {
					return fmt.Sprintf("agent_description: attribute key of %d bytes (%.40q...), more than server.agentMaxAttributeKeyBytes (%d)", len(kv.Key), kv.Key, l.MaxKeyBytes)
				}
				if n := len(anyString(kv.Value)); n > l.MaxValueBytes {
					return fmt.Sprintf("agent_description: value of attribute %.64q has %d bytes, more than server.agentMaxAttributeValueBytes (%d)", kv.Key, n, l.MaxValueBytes)
				}
			}
		}
	}
	if ec := msg.EffectiveConfig; ec != nil && ec.ConfigMap != nil {
		n := 0
		for name, f := range ec.ConfigMap.ConfigMap {
			n += len(name) + len(f.GetBody())
		}
		if n > l.MaxEffectiveConfigBytes {
			return fmt.Sprintf("effective_config: %d bytes, more than server.agentMaxEffectiveConfigBytes (%d)", n, l.MaxEffectiveConfigBytes)
		}
	}
	if h := msg.Health; h != nil {
		if n := countComponents(h, l.MaxHealthComponents+1); n > l.MaxHealthComponents {
			return fmt.Sprintf("health: more than server.agentMaxHealthComponents (%d) components", l.MaxHealthComponents)
		}
	}
	return ""
}

// countComponents counts the nested components of h, stopping at stop.
func countComponents(h *protobufs.ComponentHealth, stop int) int {
	n := 0
	for _, c := range h.ComponentHealthMap {
		n++
		if c != nil {
			n += countComponents(c, stop-n)
		}
		if n >= stop {
			break
		}
	}
	return n
}

// state turns the reported parts of msg into a store update and events,
// and updates rep. rep holds what was last stored for this connection, so
// that a message that repeats it (opamp-go repeats the capabilities) costs
// no write and no event.
func (s *Server) state(uid string, msg *protobufs.AgentToServer, now time.Time, rep *reported) store.State {
	var st store.State
	if d := msg.AgentDescription; d != nil {
		st.Identifying = attrs(d.IdentifyingAttributes)
		st.NonIdentifying = attrs(d.NonIdentifyingAttributes)
		// A full state: a remote-config status, if the agent has one, is
		// in the same message.
		rep.known = true
	}
	if msg.Capabilities != 0 && msg.Capabilities != rep.caps {
		c := msg.Capabilities
		st.Capabilities = &c
		rep.caps = c
	}
	if h := msg.Health; h != nil {
		v := h.Healthy
		st.Healthy = &v
		st.Health = healthJSON(h)
		// An event when healthy flips and when the error text changes
		// (a collector that fails in a new way); not for the first
		// report of a healthy agent.
		changed := rep.healthy == nil && (!v || h.LastError != "") ||
			rep.healthy != nil && (*rep.healthy != v || rep.lastError != h.LastError)
		if changed {
			s.ev.add(uid, now, store.EventHealthChanged, strings.TrimSpace(fmt.Sprintf("healthy=%v %s", v, h.LastError)))
		}
		rep.healthy, rep.lastError = &v, h.LastError
	}
	if ec := msg.EffectiveConfig; ec != nil && ec.ConfigMap != nil {
		var b strings.Builder
		for name, f := range ec.ConfigMap.ConfigMap {
			if name != "" && len(ec.ConfigMap.ConfigMap) > 1 {
				fmt.Fprintf(&b, "# %s\n", name)
			}
			b.Write(f.Body)
		}
		v := b.String()
		st.EffectiveConfig = &v
	}
	if rcs := msg.RemoteConfigStatus; rcs != nil {
		status := strings.ToLower(strings.TrimPrefix(rcs.Status.String(), "RemoteConfigStatuses_"))
		hash := hex.EncodeToString(rcs.LastRemoteConfigHash)
		st.RemoteConfigStatus, st.RemoteConfigHash, st.RemoteConfigError = &status, &hash, &rcs.ErrorMessage
		rep.hash, rep.known = hash, true
		kind := ""
		switch rcs.Status {
		case protobufs.RemoteConfigStatuses_RemoteConfigStatuses_APPLIED:
			kind = store.EventConfigApplied
		case protobufs.RemoteConfigStatuses_RemoteConfigStatuses_FAILED:
			kind = store.EventConfigFailed
		case protobufs.RemoteConfigStatuses_RemoteConfigStatuses_APPLYING:
			kind = store.EventConfigApplying
		}
		if kind != "" {
			s.ev.add(uid, now, kind, strings.TrimSpace(hash+" "+rcs.ErrorMessage))
		}
	}
	if ps := msg.PackageStatuses; ps != nil {
		m := map[string]any{}
		for name, p := range ps.Packages {
			m[name] = map[string]any{"agent_has_version": p.AgentHasVersion, "server_offered_version": p.ServerOfferedVersion,
				"agent_has_hash": hex.EncodeToString(p.AgentHasHash), "server_offered_hash": hex.EncodeToString(p.ServerOfferedHash),
				"status": p.Status.String(), "error": p.ErrorMessage}
		}
		st.PackageStatuses = map[string]any{"packages": m, "error": ps.ErrorMessage,
			"server_provided_all_packages_hash": hex.EncodeToString(ps.ServerProvidedAllPackagesHash)}
	}
	return st
}

// healthJSON is the stored form of a ComponentHealth, components nested as
// the agent reports them (the OpenTelemetry Collector: pipelines, then
// their receivers, processors and exporters).
func healthJSON(h *protobufs.ComponentHealth) json.RawMessage {
	b, _ := json.Marshal(healthMap(h))
	return b
}

func healthMap(h *protobufs.ComponentHealth) map[string]any {
	m := map[string]any{"healthy": h.Healthy, "status": h.Status, "last_error": h.LastError,
		"start_time_unix_nano": h.StartTimeUnixNano, "status_time_unix_nano": h.StatusTimeUnixNano}
	comp := map[string]any{}
	for name, c := range h.ComponentHealthMap {
		if c != nil {
			comp[name] = healthMap(c)
		}
	}
	m["components"] = comp
	return m
}

func attrs(kvs []*protobufs.KeyValue) map[string]string {
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		out[kv.Key] = anyString(kv.Value)
	}
	return out
}

func anyString(v *protobufs.AnyValue) string {
	if v == nil {
		return ""
	}
	switch x := v.Value.(type) {
	case *protobufs.AnyValue_StringValue:
		return x.StringValue
	case *protobufs.AnyValue_BoolValue:
		return strconv.FormatBool(x.BoolValue)
	case *protobufs.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *protobufs.AnyValue_DoubleValue:
		return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
	case *protobufs.AnyValue_BytesValue:
		return hex.EncodeToString(x.BytesValue)
	default:
		b, _ := json.Marshal(v)
		return string(b)
	}
}

// isHeartbeat reports whether msg carries nothing but what opamp-go puts
// into every message (instance UID, sequence number, capabilities): a
// heartbeat, sent one heartbeat interval after the agent's previous
// message (opamp-go's WSSender restarts its heartbeat timer on every
// send).
func isHeartbeat(msg *protobufs.AgentToServer) bool {
	only := true
	msg.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		switch fd.Name() {
		case "instance_uid", "sequence_num", "capabilities":
			return true
		}
		only = false
		return false
	})
	return only
}
