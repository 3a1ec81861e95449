package telemetry

import (
	"errors"
	"fmt"
	"math"
	"mime"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
)

// ErrContentType is returned by Decode for a body that is neither
// OTLP protobuf nor OTLP JSON.
var ErrContentType = errors.New("Content-Type must be application/x-protobuf or application/json (OTLP/HTTP)")

// Decode reads an OTLP/HTTP metrics export request (protobuf or JSON, by
// contentType) with the OpenTelemetry decoder and returns the catalog's
// series it carries: data points of one series (several transports of one
// receiver, several senders of one route) are summed. JSON reports whether
// the request was JSON (the answer is in the same encoding).
func Decode(body []byte, contentType string) (map[Key]float64, bool, error) {
	mt, _, _ := mime.ParseMediaType(contentType)
	req := pmetricotlp.NewExportRequest()
	json := false
	switch mt {
	case "application/x-protobuf", "application/protobuf":
		if err := req.UnmarshalProto(body); err != nil {
			return nil, false, fmt.Errorf("body: not an OTLP protobuf ExportMetricsServiceRequest: %w", err)
		}
	case "application/json":
		json = true
		if err := req.UnmarshalJSON(body); err != nil {
			return nil, true, fmt.Errorf("body: not an OTLP JSON ExportMetricsServiceRequest: %w", err)
		}
	default:
		return nil, false, fmt.Errorf("Content-Type %q: %w", contentType, ErrContentType)
	}
	return Samples(req.Metrics()), json, nil
}

// Samples maps the metrics of md onto the catalog (see mapName).
func Samples(md pmetric.Metrics) map[Key]float64 {
	out := map[Key]float64{}
	rms := md.ResourceMetrics()
	for i := range rms.Len() {
		sms := rms.At(i).ScopeMetrics()
		for j := range sms.Len() {
			ms := sms.At(j).Metrics()
			for k := range ms.Len() {
				addMetric(out, ms.At(k))
			}
		}
	}
	// NaN and the infinities (sent, or a sum that overflowed) are not
	// kept: JSON has no words for them, and one in the batcher's rows
	// failed the encoding of the whole flush, every agent's samples lost.
	for k, v := range out {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			delete(out, k)
		}
	}
	return out
}

func addMetric(out map[Key]float64, m pmetric.Metric) {
	name := normalize(m.Name())
	var dps pmetric.NumberDataPointSlice
	switch m.Type() {
	case pmetric.MetricTypeSum:
		// Only cumulative sums: a rate is read from two cumulative values.
		if m.Sum().AggregationTemporality() != pmetric.AggregationTemporalityCumulative {
			return
		}
		dps = m.Sum().DataPoints()
	case pmetric.MetricTypeGauge:
		dps = m.Gauge().DataPoints()
	default:
		return
	}
	for i := range dps.Len() {
		dp := dps.At(i)
		k, ok := mapName(name, dp.Attributes())
		if !ok || !validComponent(k.Component) {
			continue
		}
		v := dp.DoubleValue()
		if dp.ValueType() == pmetric.NumberDataPointValueTypeInt {
			v = float64(dp.IntValue())
		}
		out[k] += v
	}
}

// normalize writes a metric name the Prometheus way: dots as underscores,
// without a _total suffix.
func normalize(n string) string {
	n = strings.ReplaceAll(n, ".", "_")
	return strings.TrimSuffix(n, "_total")
}

// MaxComponentBytes bounds a series' component ("route/" and the route's
// ID): the agent writes it, and each series is kept in memory (the
// batcher's series lists), in every bucket row of the agent, and drawn in
// the UI. A bridge ID has at most 128 characters.
const MaxComponentBytes = 256

// validComponent refuses a component longer than MaxComponentBytes, not
// UTF-8, or with control characters.
func validComponent(c string) bool {
	if len(c) > MaxComponentBytes || !utf8.ValidString(c) {
		return false
	}
	return !strings.ContainsFunc(c, unicode.IsControl)
}

func attr(a pcommon.Map, key string) string {
	if v, ok := a.Get(key); ok {
		return v.AsString()
	}
	return ""
}

// mapName maps a metric (normalized name) and the attributes of a data
// point onto a catalog series.
func mapName(n string, a pcommon.Map) (Key, bool) {
	if rest, ok := strings.CutPrefix(n, "otelcol_receiver_"); ok {
		for _, p := range []struct{ prefix, name string }{{"accepted_", "accepted."}, {"refused_", "refused."}, {"failed_", "failed."}} {
			if sig, ok := strings.CutPrefix(rest, p.prefix); ok && isSignal(sig) {
				return Key{Name: p.name + sig, Component: "receiver/" + attr(a, "receiver")}, true
			}
		}
		return Key{}, false
	}
	if rest, ok := strings.CutPrefix(n, "otelcol_exporter_"); ok {
		for _, p := range []struct{ prefix, name string }{{"sent_", "sent."}, {"send_failed_", "failed."}} {
			if sig, ok := strings.CutPrefix(rest, p.prefix); ok && isSignal(sig) {
				return Key{Name: p.name + sig, Component: "exporter/" + attr(a, "exporter")}, true
			}
		}
		return Key{}, false
	}
	route := "route/" + attr(a, "route")
	session := "session/" + attr(a, "session")
	switch n {
	case "myriarch_bridge_messages_in":
		return Key{"received", route}, true
	case "myriarch_bridge_messages_out":
		return Key{"delivered", route}, true
	case "myriarch_bridge_messages_dead_lettered":
		return Key{"dead_lettered", route}, true
	case "myriarch_bridge_messages_in_flight":
		return Key{"in_flight", route}, true
	case "myriarch_bridge_failover_failure_to_full_seconds":
		return Key{"takeover.failure_to_full", session}, true
	case "myriarch_bridge_failover_budget_seconds":
		return Key{"takeover.budget", session}, true
	case "myriarch_bridge_failover_slo_seconds":
		return Key{"takeover.slo", session}, true
	}
	return Key{}, false
}

func isSignal(s string) bool {
	for _, x := range signals {
		if s == x {
			return true
		}
	}
	return false
}
