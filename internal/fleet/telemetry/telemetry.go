// Package telemetry keeps the agents' own metrics: what an OpenTelemetry
// Collector and myriarch-bridge send, through the destination that
// myriarchd offers them over OpAMP (ConnectionSettingsOffers.own_metrics),
// to the OTLP/HTTP endpoint of the OpAMP listener (opampserver mounts
// Handler behind its body guard: the agent's own credential, checked before
// a byte of the body is read; the body bounded by
// server.opampMaxMessageBytes).
//
// It keeps only the few series an operator needs (Catalog): for a
// collector, the items each receiver accepted, refused and failed and each
// exporter sent and failed, per signal; for a bridge, the messages each
// route received, delivered, dead-lettered and holds in flight, and for
// each exclusive session its takeovers' failure-to-full with the budget
// and SLO it is held to. Everything else in a request is ignored, and an
// agent keeps at most telemetry.maxSeriesPerAgent series.
//
// Storage is downsampled at write time: every sample lands in a bucket of
// each tier (telemetry.fineResolution, telemetry.coarseResolution) of
// agent_telemetry, where the last value of the bucket wins; counters are
// kept cumulative, so a rate is the difference of two buckets divided by
// their distance, computed when read (Rates), and a reset (a restarted
// agent) starts again from zero. This makes the value of a bucket the same
// whichever replica received which request: two replicas writing the same
// bucket merge their series. Samples are held in memory and written in
// one statement per flush (Batcher, like internal/fleet/lastseen), so a
// request costs no database write of its own.
//
// The leader's job (Job) deletes what is older than each tier's
// retention and computes the fleet's sums per coarse bucket
// (fleet_telemetry): throughput, refused, failed, and the agents online,
// offline and unhealthy.
package telemetry

import (
	"sort"
	"strings"
	"time"
)

// Kind is how a series' values are read.
type Kind int

const (
	// Counter values are cumulative; they are read as a rate per second.
	Counter Kind = iota
	// Gauge values are read as they are.
	Gauge
)

// Entry describes one series name of the catalog.
type Entry struct {
	Name string
	Kind Kind
	// Unit of the value as read (a rate for counters).
	Unit string
	// Class groups names for the fleet sums and the alert: "throughput",
	// "refused", "failed", or "" (none).
	Class string
	// Meaning, for the docs.
	Meaning string
}

var signals = []string{"spans", "metric_points", "log_records"}

// Catalog is every series name kept, keyed by name.
var Catalog = func() map[string]Entry {
	m := map[string]Entry{}
	add := func(e Entry) { m[e.Name] = e }
	for _, s := range signals {
		add(Entry{Name: "accepted." + s, Unit: "items/s", Class: "throughput", Meaning: "items a collector receiver accepted (otelcol_receiver_accepted_" + s + ")"})
		add(Entry{Name: "refused." + s, Unit: "items/s", Class: "refused", Meaning: "items a collector receiver refused (otelcol_receiver_refused_" + s + ")"})
		add(Entry{Name: "failed." + s, Unit: "items/s", Class: "failed", Meaning: "items a collector receiver failed to take, or an exporter failed to send (otelcol_receiver_failed_" + s + ", otelcol_exporter_send_failed_" + s + ")"})
		add(Entry{Name: "sent." + s, Unit: "items/s", Meaning: "items a collector exporter sent (otelcol_exporter_sent_" + s + ")"})
	}
	add(Entry{Name: "received", Unit: "messages/s", Class: "throughput", Meaning: "messages a bridge route received (myriarch_bridge_messages_in_total)"})
	add(Entry{Name: "delivered", Unit: "messages/s", Meaning: "messages a bridge route's senders accepted (myriarch_bridge_messages_out_total)"})
	add(Entry{Name: "dead_lettered", Unit: "messages/s", Class: "failed", Meaning: "messages a bridge route dead-lettered (myriarch_bridge_messages_dead_lettered_total)"})
	add(Entry{Name: "in_flight", Kind: Gauge, Unit: "messages", Meaning: "messages a bridge route holds, received and not yet accepted by every sender (myriarch_bridge_messages_in_flight)"})
	add(Entry{Name: "takeover.failure_to_full", Kind: Gauge, Unit: "s", Meaning: "failure-to-full of a bridge session's last takeover, sent once per takeover (myriarch_bridge_failover_failure_to_full_seconds)"})
	add(Entry{Name: "takeover.budget", Kind: Gauge, Unit: "s", Meaning: "a bridge session's owner-death failover budget (myriarch_bridge_failover_budget_seconds)"})
	add(Entry{Name: "takeover.slo", Kind: Gauge, Unit: "s", Meaning: "a bridge session's failover_slo (myriarch_bridge_failover_slo_seconds)"})
	return m
}()

// CatalogNames is the catalog's names, sorted (for the docs).
func CatalogNames() []string {
	out := make([]string, 0, len(Catalog))
	for n := range Catalog {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Key is a series of one agent: a catalog name and the component it is of
// ("receiver/otlp", "exporter/debug", "route/plant", "session/plant").
type Key struct {
	Name      string
	Component string
}

func (k Key) String() string { return k.Name + "|" + k.Component }

func parseKey(s string) (Key, bool) {
	n, c, ok := strings.Cut(s, "|")
	if _, known := Catalog[n]; !ok || !known {
		return Key{}, false
	}
	return Key{Name: n, Component: c}, true
}

// Tiers are the two resolutions, finest first.
type Tiers struct {
	FineResolution, FineRetention     time.Duration
	CoarseResolution, CoarseRetention time.Duration
}

// DefaultTiers are the defaults of the telemetry.* settings.
var DefaultTiers = Tiers{FineResolution: 10 * time.Second, FineRetention: time.Hour,
	CoarseResolution: time.Minute, CoarseRetention: 7 * 24 * time.Hour}

// res is the resolution of tier (0 fine, 1 coarse), in seconds.
func (t Tiers) res(tier int) int64 {
	if tier == 0 {
		return int64(t.FineResolution / time.Second)
	}
	return int64(t.CoarseResolution / time.Second)
}

// For is the tier a window is read from: the fine one when it still holds
// the whole window, else the coarse one.
func (t Tiers) For(window time.Duration) int {
	if window <= t.FineRetention {
		return 0
	}
	return 1
}

// Bucket is the start (unix seconds) of the bucket of tier that at falls in.
func (t Tiers) Bucket(tier int, at time.Time) int64 {
	r := t.res(tier)
	s := at.Unix()
	return s - s%r
}
