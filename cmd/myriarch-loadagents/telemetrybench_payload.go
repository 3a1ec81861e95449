package main

// The own metrics a simulated agent of the telemetry command sends: what
// an OpenTelemetry Collector's internal telemetry pushes over OTLP/HTTP
// (its periodic reader), built with the pdata module myriarchd decodes
// with. Counters are cumulative and follow the wall clock
// (rate × seconds since the run's epoch), so the history the command
// seeds and what an agent sends later are one series.

import (
	"strings"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"

	"github.com/myriarch/myriarch/internal/fleet/telemetry"
)

// collectorShape is the pipeline of the simulated collector: receivers
// (with their transports: one series per receiver, summed by myriarchd)
// and exporters, per signal.
var collectorShape = struct {
	receivers []struct {
		id         string
		transports []string
		signals    []string
	}
	exporters []struct {
		id      string
		signals []string
	}
}{
	receivers: []struct {
		id         string
		transports []string
		signals    []string
	}{
		{"otlp", []string{"grpc", "http"}, []string{"spans", "metric_points", "log_records"}},
		{"hostmetrics", []string{""}, []string{"metric_points"}},
		{"filelog", []string{""}, []string{"log_records"}},
	},
	exporters: []struct {
		id      string
		signals []string
	}{
		{"otlp", []string{"spans", "metric_points", "log_records"}},
		{"debug", []string{"spans", "metric_points", "log_records"}},
	},
}

// catalogSeries is the number of catalog series one agent sends.
func catalogSeries() int {
	n := 0
	for _, r := range collectorShape.receivers {
		n += 3 * len(r.signals) // accepted, refused, failed
	}
	for _, e := range collectorShape.exporters {
		n += 2 * len(e.signals) // sent, send_failed
	}
	return n
}

// payload is the OTLP protobuf export request of agent index i at time at,
// counters counted from epoch.
func payload(i int, instance string, epoch, at time.Time) ([]byte, error) {
	md := collectorMetrics(i, instance, epoch, at)
	return pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()
}

// rateOf is the per-second rate of a counter of agent i (a few hundred
// items per second, different per agent and series).
func rateOf(i, series int) float64 { return float64(100 + (i*7+series*13)%400) }

func collectorMetrics(i int, instance string, epoch, at time.Time) pmetric.Metrics {
	el := max(0, at.Sub(epoch).Seconds())
	start := pcommon.NewTimestampFromTime(epoch)
	now := pcommon.NewTimestampFromTime(at)
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	ra := rm.Resource().Attributes()
	ra.PutStr("service.name", "otelcol-contrib")
	ra.PutStr("service.version", "0.149.0")
	ra.PutStr("service.instance.id", instance)
	sm := rm.ScopeMetrics().AppendEmpty()
	sm.Scope().SetName("go.opentelemetry.io/collector/service")
	ms := sm.Metrics()
	series := 0
	counter := func(name string, attrs []string, frac float64) {
		m := ms.AppendEmpty()
		m.SetName(name)
		m.SetUnit("{items}")
		s := m.SetEmptySum()
		s.SetIsMonotonic(true)
		s.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
		for _, v := range attrs {
			dp := s.DataPoints().AppendEmpty()
			dp.SetStartTimestamp(start)
			dp.SetTimestamp(now)
			dp.SetIntValue(int64(rateOf(i, series) * frac * el))
			series++
			for _, kv := range splitAttrs(v) {
				dp.Attributes().PutStr(kv[0], kv[1])
			}
		}
	}
	for _, r := range collectorShape.receivers {
		for _, sig := range r.signals {
			for _, kind := range []struct {
				name string
				frac float64
			}{{"accepted", 1}, {"refused", 0.01}, {"failed", 0.002}} {
				var attrs []string
				for _, tr := range r.transports {
					a := "receiver=" + r.id
					if tr != "" {
						a += ",transport=" + tr
					}
					attrs = append(attrs, a)
				}
				counter("otelcol_receiver_"+kind.name+"_"+sig, attrs, kind.frac)
			}
		}
	}
	for _, e := range collectorShape.exporters {
		for _, sig := range e.signals {
			counter("otelcol_exporter_sent_"+sig, []string{"exporter=" + e.id}, 0.99)
			counter("otelcol_exporter_send_failed_"+sig, []string{"exporter=" + e.id}, 0.001)
		}
	}
	// What a collector sends besides: process and queue gauges, batch
	// counters, a histogram (myriarchd ignores them; they are in the body).
	gauge := func(name, unit string, v float64, attrs ...string) {
		m := ms.AppendEmpty()
		m.SetName(name)
		m.SetUnit(unit)
		dp := m.SetEmptyGauge().DataPoints().AppendEmpty()
		dp.SetTimestamp(now)
		dp.SetDoubleValue(v)
		for _, kv := range splitAttrs(attrs...) {
			dp.Attributes().PutStr(kv[0], kv[1])
		}
	}
	gauge("otelcol_process_uptime", "s", el)
	gauge("otelcol_process_memory_rss", "By", 120e6+float64(i%50)*1e6)
	gauge("otelcol_process_runtime_heap_alloc_bytes", "By", 60e6)
	gauge("otelcol_process_runtime_total_sys_memory_bytes", "By", 150e6)
	gauge("otelcol_process_cpu_seconds", "s", el*0.05)
	for _, e := range collectorShape.exporters {
		gauge("otelcol_exporter_queue_size", "{batches}", float64(i%7), "exporter="+e.id)
		gauge("otelcol_exporter_queue_capacity", "{batches}", 1000, "exporter="+e.id)
	}
	for _, p := range []string{"otelcol_processor_incoming_items", "otelcol_processor_outgoing_items", "otelcol_processor_batch_timeout_trigger_send"} {
		m := ms.AppendEmpty()
		m.SetName(p)
		s := m.SetEmptySum()
		s.SetIsMonotonic(true)
		s.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
		dp := s.DataPoints().AppendEmpty()
		dp.SetStartTimestamp(start)
		dp.SetTimestamp(now)
		dp.SetIntValue(int64(500 * el))
		dp.Attributes().PutStr("processor", "batch")
	}
	h := ms.AppendEmpty()
	h.SetName("otelcol_processor_batch_batch_send_size")
	hs := h.SetEmptyHistogram()
	hs.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
	hdp := hs.DataPoints().AppendEmpty()
	hdp.SetStartTimestamp(start)
	hdp.SetTimestamp(now)
	bounds := []float64{10, 25, 50, 75, 100, 250, 500, 750, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 20000, 30000, 50000, 100000}
	hdp.ExplicitBounds().FromRaw(bounds)
	counts := make([]uint64, len(bounds)+1)
	var total uint64
	for b := range counts {
		counts[b] = uint64(el) * uint64(1+b%5)
		total += counts[b]
	}
	hdp.BucketCounts().FromRaw(counts)
	hdp.SetCount(total)
	hdp.SetSum(float64(total) * 400)
	hdp.Attributes().PutStr("processor", "batch")
	return md
}

// splitAttrs reads "k=v,k2=v2" strings into pairs.
func splitAttrs(ss ...string) [][2]string {
	var out [][2]string
	for _, s := range ss {
		for kv := range strings.SplitSeq(s, ",") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				out = append(out, [2]string{k, v})
			}
		}
	}
	return out
}

// seedSamples are the catalog samples agent i's payload at at carries, as
// myriarchd decodes them (telemetry.Samples): the command seeds the
// history of the agents the UI pages show with them.
func seedSamples(i int, instance string, epoch, at time.Time) map[telemetry.Key]float64 {
	return telemetry.Samples(collectorMetrics(i, instance, epoch, at))
}
