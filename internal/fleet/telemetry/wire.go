package telemetry

import (
	"errors"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// The protobuf fast path
//
// Decoding a collector's export request with pdata built every metric,
// data point and attribute of it (about 40 metrics, a histogram among
// them) to keep 27 numbers: at 1,000 requests a second it was a quarter
// of the replica's CPU (docs/myriarchd.md, Telemetry, Measured). scan
// walks the OTLP wire format instead (ExportMetricsServiceRequest →
// ResourceMetrics → ScopeMetrics → Metric → Sum | Gauge →
// NumberDataPoint → KeyValue) and reads only the metrics whose name the
// catalog maps, skipping the bytes of everything else unread.
//
// It answers what Samples answers for the same body, or says that it
// cannot (errUnsure), and Decode then asks pdata: a body that does not
// parse, a field of a known number with another wire type, a metric with
// two names or two kinds of data, a data point with both an int and a
// double, or a component attribute that is not a string (pdata would
// print it) all go to pdata, which decodes or refuses them as before. What
// scan skips it does not validate (a malformed resource is not looked
// at); TestScanAgreesWithPdata holds the two to the same answer.

// errUnsure: the body is left to pdata.
var errUnsure = errors.New("left to pdata")

// OTLP field numbers (opentelemetry-proto, metrics/v1 and common/v1).
const (
	fRequestResourceMetrics = 1
	fResourceScopeMetrics   = 2
	fScopeMetrics           = 2
	fMetricName             = 1
	fMetricGauge            = 5
	fMetricSum              = 7
	fMetricHistogram        = 9
	fMetricExpHistogram     = 10
	fMetricSummary          = 11
	fGaugeDataPoints        = 1
	fSumDataPoints          = 1
	fSumTemporality         = 2
	fPointAsDouble          = 4
	fPointAsInt             = 6
	fPointAttributes        = 7
	fKeyValueKey            = 1
	fKeyValueValue          = 2
	fAnyValueString         = 1
	temporalityCumulative   = 2
)

// scan is Samples(decoded b) for an OTLP protobuf body, or errUnsure.
func scan(b []byte) (map[Key]float64, error) {
	out := map[Key]float64{}
	err := fields(b, func(num protowire.Number, typ protowire.Type, v []byte, raw uint64) error {
		if num != fRequestResourceMetrics {
			return nil
		}
		if typ != protowire.BytesType {
			return errUnsure
		}
		return fields(v, func(num protowire.Number, typ protowire.Type, v []byte, raw uint64) error {
			if num != fResourceScopeMetrics {
				return nil
			}
			if typ != protowire.BytesType {
				return errUnsure
			}
			return fields(v, func(num protowire.Number, typ protowire.Type, v []byte, raw uint64) error {
				if num != fScopeMetrics {
					return nil
				}
				if typ != protowire.BytesType {
					return errUnsure
				}
				return scanMetric(out, v)
			})
		})
	})
	if err != nil {
		return nil, err
	}
	dropNonFinite(out)
	return out, nil
}

// mappable reports whether mapName can map a metric of normalized name n
// (whatever its attributes).
func mappable(n string) bool {
	if len(n) > len("otelcol_receiver_") && n[:len("otelcol_receiver_")] == "otelcol_receiver_" ||
		len(n) > len("otelcol_exporter_") && n[:len("otelcol_exporter_")] == "otelcol_exporter_" {
		return true
	}
	switch n {
	case "myriarch_bridge_messages_in", "myriarch_bridge_messages_out", "myriarch_bridge_messages_dead_lettered",
		"myriarch_bridge_messages_in_flight", "myriarch_bridge_failover_failure_to_full_seconds",
		"myriarch_bridge_failover_budget_seconds", "myriarch_bridge_failover_slo_seconds":
		return true
	}
	return false
}

func scanMetric(out map[Key]float64, b []byte) error {
	var name, data []byte
	names, kinds := 0, 0
	isSum := false
	err := fields(b, func(num protowire.Number, typ protowire.Type, v []byte, raw uint64) error {
		switch num {
		case fMetricName:
			if typ != protowire.BytesType {
				return errUnsure
			}
			name, names = v, names+1
		case fMetricGauge, fMetricSum:
			if typ != protowire.BytesType {
				return errUnsure
			}
			data, isSum, kinds = v, num == fMetricSum, kinds+1
		case fMetricHistogram, fMetricExpHistogram, fMetricSummary:
			kinds++
		}
		return nil
	})
	if err != nil || names > 1 || kinds > 1 {
		return errUnsure
	}
	if data == nil {
		return nil // no number data: ignored, as pdata's path does
	}
	n := normalize(string(name))
	if !mappable(n) {
		return nil
	}
	cumulative := false
	var points [][]byte
	err = fields(data, func(num protowire.Number, typ protowire.Type, v []byte, raw uint64) error {
		switch {
		case num == fSumDataPoints: // fGaugeDataPoints too
			if typ != protowire.BytesType {
				return errUnsure
			}
			points = append(points, v)
		case isSum && num == fSumTemporality:
			if typ != protowire.VarintType {
				return errUnsure
			}
			cumulative = raw == temporalityCumulative
		}
		return nil
	})
	if err != nil {
		return err
	}
	if isSum && !cumulative {
		return nil
	}
	for _, p := range points {
		if err := scanPoint(out, n, p); err != nil {
			return err
		}
	}
	return nil
}

func scanPoint(out map[Key]float64, name string, b []byte) error {
	var attrs [4]string // receiver, exporter, route, session
	var seen [4]bool
	value, values := 0.0, 0
	err := fields(b, func(num protowire.Number, typ protowire.Type, v []byte, raw uint64) error {
		switch num {
		case fPointAsDouble:
			if typ != protowire.Fixed64Type {
				return errUnsure
			}
			value, values = math.Float64frombits(raw), values+1
		case fPointAsInt:
			if typ != protowire.Fixed64Type {
				return errUnsure
			}
			value, values = float64(int64(raw)), values+1
		case fPointAttributes:
			if typ != protowire.BytesType {
				return errUnsure
			}
			return scanAttr(v, &attrs, &seen)
		}
		return nil
	})
	if err != nil || values > 1 {
		return errUnsure
	}
	k, ok := mapName(name, func(key string) string {
		if i := attrIndex(key); i >= 0 {
			return attrs[i]
		}
		return ""
	})
	if !ok || !validComponent(k.Component) {
		return nil
	}
	out[k] += value
	return nil
}

var attrKeys = [4]string{"receiver", "exporter", "route", "session"}

func attrIndex(key string) int {
	for i, k := range attrKeys {
		if k == key {
			return i
		}
	}
	return -1
}

// scanAttr reads one KeyValue; the first of a key wins (pdata's Get).
func scanAttr(b []byte, attrs *[4]string, seen *[4]bool) error {
	var key, val []byte
	keys, vals := 0, 0
	err := fields(b, func(num protowire.Number, typ protowire.Type, v []byte, raw uint64) error {
		switch num {
		case fKeyValueKey:
			if typ != protowire.BytesType {
				return errUnsure
			}
			key, keys = v, keys+1
		case fKeyValueValue:
			if typ != protowire.BytesType {
				return errUnsure
			}
			val, vals = v, vals+1
		}
		return nil
	})
	if err != nil || keys > 1 || vals > 1 {
		return errUnsure
	}
	i := attrIndex(string(key))
	if i < 0 || seen[i] {
		return nil
	}
	seen[i] = true
	if val == nil {
		return nil // an empty value: ""
	}
	s, strs := "", 0
	err = fields(val, func(num protowire.Number, typ protowire.Type, v []byte, raw uint64) error {
		if num != fAnyValueString || typ != protowire.BytesType {
			return errUnsure // another kind of value: pdata prints it
		}
		s, strs = string(v), strs+1
		return nil
	})
	if err != nil || strs > 1 {
		return errUnsure
	}
	attrs[i] = s
	return nil
}

// fields calls f for each field of the message b: v is the bytes of a
// length-delimited field, raw the value of a varint or fixed one; an
// error of f stops it.
func fields(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte, raw uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errUnsure
		}
		b = b[n:]
		var v []byte
		var raw uint64
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.Fixed64Type:
			raw, n = protowire.ConsumeFixed64(b)
		case protowire.VarintType:
			raw, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var r32 uint32
			r32, n = protowire.ConsumeFixed32(b)
			raw = uint64(r32)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return errUnsure
		}
		if err := f(num, typ, v, raw); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}
