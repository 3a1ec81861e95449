package telemetry

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
)

// randomMetrics is an export request of what collectors and bridges send
// and of what they should not: catalog and other names, cumulative and
// delta sums, gauges, histograms, int and double values, NaN, several
// data points of one series, component attributes that are strings,
// numbers, empty, repeated or too long.
func randomMetrics(r *rand.Rand) pmetric.Metrics {
	names := []string{"otelcol_receiver_accepted_spans", "otelcol_receiver_refused_metric_points", "otelcol_receiver_failed_log_records",
		"otelcol.receiver.accepted.log_records", "otelcol_receiver_accepted_spans_total", "otelcol_receiver_accepted_widgets",
		"otelcol_exporter_sent_spans", "otelcol_exporter_send_failed_metric_points", "otelcol_exporter_queue_size",
		"myriarch_bridge_messages_in_total", "myriarch_bridge_messages_out", "myriarch_bridge_messages_dead_lettered_total",
		"myriarch_bridge_messages_in_flight", "myriarch_bridge_failover_failure_to_full_seconds", "myriarch_bridge_failover_budget_seconds",
		"myriarch_bridge_failover_slo_seconds", "otelcol_process_uptime", "http.server.duration", ""}
	keys := []string{"receiver", "exporter", "route", "session", "transport", "other"}
	md := pmetric.NewMetrics()
	for range 1 + r.IntN(2) {
		rm := md.ResourceMetrics().AppendEmpty()
		rm.Resource().Attributes().PutStr("service.instance.id", "x")
		for range 1 + r.IntN(2) {
			ms := rm.ScopeMetrics().AppendEmpty().Metrics()
			for range r.IntN(12) {
				m := ms.AppendEmpty()
				m.SetName(names[r.IntN(len(names))])
				var dps pmetric.NumberDataPointSlice
				switch r.IntN(5) {
				case 0, 1:
					s := m.SetEmptySum()
					s.SetAggregationTemporality([]pmetric.AggregationTemporality{pmetric.AggregationTemporalityCumulative,
						pmetric.AggregationTemporalityCumulative, pmetric.AggregationTemporalityDelta, pmetric.AggregationTemporalityUnspecified}[r.IntN(4)])
					dps = s.DataPoints()
				case 2, 3:
					dps = m.SetEmptyGauge().DataPoints()
				default:
					h := m.SetEmptyHistogram().DataPoints().AppendEmpty()
					h.SetCount(3)
					h.Attributes().PutStr("receiver", "otlp")
					continue
				}
				for range r.IntN(4) {
					dp := dps.AppendEmpty()
					switch r.IntN(6) {
					case 0:
						dp.SetDoubleValue(math.NaN())
					case 1, 2:
						dp.SetDoubleValue(r.Float64() * 1e6)
					case 3:
						// no value
					default:
						dp.SetIntValue(r.Int64N(1 << 40))
					}
					for range r.IntN(4) {
						k := keys[r.IntN(len(keys))]
						switch r.IntN(8) {
						case 0:
							dp.Attributes().PutInt(k, 7)
						case 1:
							dp.Attributes().PutBool(k, true)
						case 2:
							dp.Attributes().PutStr(k, strings.Repeat("x", 300))
						case 3:
							dp.Attributes().PutStr(k, "bad\x01")
						case 4:
							dp.Attributes().PutEmpty(k)
						default:
							dp.Attributes().PutStr(k, []string{"otlp", "debug", "plant", "r/1"}[r.IntN(4)])
						}
					}
				}
			}
		}
	}
	return md
}

// The protobuf fast path answers what pdata answers, on random bodies
// and on every prefix of some (a prefix either parses as a message of
// its own or is refused by both), or leaves the body to pdata.
// BenchmarkDecode is the cost of a request's body: pdata's decoding of a
// random export request of about 3 KB and the catalog's walk over it.
func BenchmarkDecode(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	var body []byte
	for len(body) < 3000 {
		body, _ = pmetricotlp.NewExportRequestFromMetrics(randomMetrics(r)).MarshalProto()
	}
	b.Run(fmt.Sprintf("pdata/%dB", len(body)), func(b *testing.B) {
		for b.Loop() {
			if _, _, err := Decode(body, "application/x-protobuf"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// The rows' JSON, written by hand, reads back as what was written.
func TestAppendSeries(t *testing.T) {
	in := map[string]float64{"accepted.spans|receiver/otlp": 1.5e9, `received|route/a"b\c`: 0.1, "in_flight|route/ü": -3,
		SampledAtKey: 1765158000.123, "x|y": 1e-7, "z|w": 1e21}
	var out map[string]float64
	if err := json.Unmarshal(appendSeries(nil, in), &out); err != nil || !reflect.DeepEqual(in, out) {
		t.Fatalf("%s: %v %v", appendSeries(nil, in), out, err)
	}
	if b := string(appendSeries(nil, map[string]float64{"a\x00": math.NaN()})); b != `{"a\ufffd":0}` {
		t.Fatalf("%s", b)
	}
	if b := string(appendSeries(nil, nil)); b != "{}" {
		t.Fatalf("%s", b)
	}
}
