package telemetry

import (
	"context"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/fleet/fleettest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// collectorMetrics is what a collector's own telemetry exports (names as
// the collector's OTLP exporter writes them), with v accepted spans on
// two transports of one receiver, and noise the catalog does not keep.
func collectorMetrics(v int64) pmetric.Metrics {
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	rm.Resource().Attributes().PutStr("service.instance.id", "someone-else")
	ms := rm.ScopeMetrics().AppendEmpty().Metrics()
	sum := func(name string, attrs map[string]string, val int64, temp pmetric.AggregationTemporality) {
		m := ms.AppendEmpty()
		m.SetName(name)
		s := m.SetEmptySum()
		s.SetIsMonotonic(true)
		s.SetAggregationTemporality(temp)
		dp := s.DataPoints().AppendEmpty()
		dp.SetIntValue(val)
		for k, a := range attrs {
			dp.Attributes().PutStr(k, a)
		}
	}
	cum := pmetric.AggregationTemporalityCumulative
	sum("otelcol_receiver_accepted_spans", map[string]string{"receiver": "otlp", "transport": "http"}, v, cum)
	sum("otelcol_receiver_accepted_spans", map[string]string{"receiver": "otlp", "transport": "grpc"}, v, cum)
	sum("otelcol_receiver_refused_spans", map[string]string{"receiver": "otlp", "transport": "http"}, 3, cum)
	sum("otelcol.exporter.sent.spans", map[string]string{"exporter": "debug"}, 2*v, cum)
	sum("otelcol_exporter_send_failed_log_records_total", map[string]string{"exporter": "debug"}, 1, cum)
	sum("otelcol_receiver_accepted_spans", map[string]string{"receiver": "delta"}, 99, pmetric.AggregationTemporalityDelta)
	sum("otelcol_process_uptime", nil, 12, cum)
	g := ms.AppendEmpty()
	g.SetName("myriarch_bridge_messages_in_flight")
	dp := g.SetEmptyGauge().DataPoints().AppendEmpty()
	dp.SetDoubleValue(4)
	dp.Attributes().PutStr("route", "plant")
	return md
}

func TestDecodeProtobufAndJSON(t *testing.T) {
	req := pmetricotlp.NewExportRequestFromMetrics(collectorMetrics(10))
	pb, err := req.MarshalProto()
	if err != nil {
		t.Fatal(err)
	}
	js, err := req.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	want := map[Key]float64{
		{"accepted.spans", "receiver/otlp"}:      20, // two transports, summed
		{"refused.spans", "receiver/otlp"}:       3,
		{"sent.spans", "exporter/debug"}:         20,
		{"failed.log_records", "exporter/debug"}: 1,
		{"in_flight", "route/plant"}:             4,
	}
	for _, c := range []struct {
		body []byte
		ct   string
		json bool
	}{{pb, "application/x-protobuf", false}, {js, "application/json; charset=utf-8", true}} {
		got, isJSON, err := Decode(c.body, c.ct)
		if err != nil {
			t.Fatalf("%s: %v", c.ct, err)
		}
		if isJSON != c.json {
			t.Errorf("%s: json %v", c.ct, isJSON)
		}
		if len(got) != len(want) {
			t.Errorf("%s: got %v, want %v (the delta sum and the uptime are not kept)", c.ct, got, want)
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %v = %v, want %v", c.ct, k, got[k], v)
			}
		}
	}
	if _, _, err := Decode(pb, "text/plain"); err == nil || !errorsIs(err, ErrContentType) {
		t.Errorf("text/plain: %v", err)
	}
	if _, _, err := Decode([]byte("\xff\xff garbage"), "application/x-protobuf"); err == nil {
		t.Error("garbage decoded")
	}
}

func errorsIs(err, target error) bool {
	for e := err; e != nil; {
		if e == target {
			return true
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		e = u.Unwrap()
	}
	return false
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type counts struct{ on, off, bad int64 }

func (c counts) Counts(context.Context) (int64, int64, int64, error) { return c.on, c.off, c.bad, nil }

// Two replicas receive one agent's samples (a balancer sends each
// request anywhere); the rates read back are those of the counters,
// whichever replica wrote which bucket; a counter that goes back is a
// restart; the leader's job sums the fleet and deletes what is past
// retention, through its fence.
func TestStoreRatesFleetAndRetention(t *testing.T) {
	ctx, st, lead := fleettest.LeaderStore(t, 6)
	clk := &fakeClock{t: time.Unix(1_800_000_000, 0)} // a multiple of 60 s
	tiers := DefaultTiers
	mk := func() *Batcher {
		return NewBatcher(BatcherOptions{Pool: st.Pool, Tiers: tiers, FlushInterval: time.Hour, MaxSeriesPerAgent: 3, Now: clk.now})
	}
	a, b := mk(), mk()
	rd := &Reader{Pool: st.Pool, Tiers: tiers, Now: clk.now}
	acc := Key{"accepted.spans", "receiver/otlp"}
	inflight := Key{"in_flight", "route/r"}
	// 100 spans/s for 2 minutes, every 10 s, alternating replicas.
	var v float64
	for i := range 13 {
		rep := a
		if i%2 == 1 {
			rep = b
		}
		rep.Add("agent-1", map[Key]float64{acc: v, inflight: float64(i)})
		rep.Add("agent-2", map[Key]float64{{"received", "route/x"}: v / 10})
		if i < 12 {
			clk.add(10 * time.Second)
			v += 1000
		}
	}
	// A series beyond telemetry.maxSeriesPerAgent (3) is dropped.
	a.Add("agent-1", map[Key]float64{{"sent.spans", "exporter/a"}: 1, {"sent.spans", "exporter/b"}: 1})
	for _, bt := range []*Batcher{a, b} {
		if err := bt.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w, err := rd.Agent(ctx, "agent-1", 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if w.ResolutionS != 10 {
		t.Fatalf("resolution %v", w.ResolutionS)
	}
	var accS, inS *Series
	for i := range w.Series {
		switch w.Series[i].Name {
		case "accepted.spans":
			accS = &w.Series[i]
		case "in_flight":
			inS = &w.Series[i]
		}
	}
	if len(w.Series) != 3 || accS == nil || inS == nil {
		t.Fatalf("series %+v", w.Series)
	}
	if len(accS.Points) < 11 {
		t.Fatalf("accepted points %v", accS.Points)
	}
	for _, p := range accS.Points {
		if math.Abs(p[1]-100) > 1e-9 {
			t.Fatalf("rate %v at %v, want 100/s: %v", p[1], p[0], accS.Points)
		}
	}
	if last := inS.Points[len(inS.Points)-1]; last[1] != 12 || accS.Unit != "items/s" || inS.Unit != "messages" {
		t.Fatalf("in_flight %v, units %q %q", inS.Points, accS.Unit, inS.Unit)
	}

	// A restart: the counter starts again from 0.
	clk.add(10 * time.Second)
	a.Add("agent-1", map[Key]float64{acc: 500})
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	w, _ = rd.Agent(ctx, "agent-1", time.Minute)
	for _, s := range w.Series {
		if s.Name == "accepted.spans" {
			if last := s.Points[len(s.Points)-1]; last[1] != 50 {
				t.Fatalf("after a reset: %v, want 500/10s = 50", s.Points)
			}
		}
	}

	// The coarse tier (a window past the fine retention): one rate per minute.
	w, err = rd.Agent(ctx, "agent-1", 2*time.Hour)
	if err != nil || w.ResolutionS != 60 {
		t.Fatalf("coarse: %v %+v", err, w)
	}

	// The leader's job: fleet sums of the last complete minute.
	clk.add(time.Minute)
	agg := NewAggregates()
	job := rd.Job(counts{on: 2, off: 1, bad: 1}, agg)
	fence := func(ctx context.Context, fn func(context.Context, pgx.Tx) error) error {
		return lead.InTerm(ctx, fn)
	}
	if err := job.Run(ctx, fence); err != nil {
		t.Fatal(err)
	}
	fw, err := rd.Fleet(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][][2]float64{}
	for _, s := range fw.Series {
		got[s.Name] = s.Points
	}
	if p := got["agents.online"]; len(p) != 1 || p[0][1] != 2 {
		t.Fatalf("agents.online %v", p)
	}
	// Throughput of the minute that ended: agent-1 accepted spans and
	// agent-2's received messages (a tenth) from the minute before.
	if p := got["throughput"]; len(p) != 1 || p[0][1] <= 0 {
		t.Fatalf("throughput %v (all %v)", p, got)
	}
	if agg.vals["throughput"] != got["throughput"][0][1] {
		t.Fatalf("aggregates %v vs %v", agg.vals, got["throughput"])
	}

	// Retention: two hours later the fine tier is gone, the coarse kept.
	clk.add(2 * time.Hour)
	if err := job.Run(ctx, fence); err != nil {
		t.Fatal(err)
	}
	var fine, coarse int
	if err := st.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE tier = 0), count(*) FILTER (WHERE tier = 1) FROM agent_telemetry`).Scan(&fine, &coarse); err != nil {
		t.Fatal(err)
	}
	if fine != 0 || coarse == 0 {
		t.Fatalf("after the fine retention: %d fine, %d coarse rows", fine, coarse)
	}
	if err := rd.CheckWindow(8 * 24 * time.Hour); err == nil {
		t.Fatal("a window past the coarse retention was accepted")
	}
}

// An agent names the components of its series (a route's ID, a
// receiver's name): one of 1 MiB would be kept in the batcher's series
// list, in each of the agent's bucket rows and in the UI's charts, up to
// telemetry.maxSeriesPerAgent times. Such a data point is dropped, as is
// one whose component holds control characters or is not UTF-8: a NUL
// (which PostgreSQL's jsonb refuses) failed every flush's one INSERT, and
// the batcher put the rows back each time, so no agent's samples were
// written any more. The others are kept.
func TestDecodeBoundsComponents(t *testing.T) {
	md := pmetric.NewMetrics()
	ms := md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics()
	g := ms.AppendEmpty()
	g.SetName("myriarch_bridge_messages_in_flight")
	dps := g.SetEmptyGauge().DataPoints()
	for _, route := range []string{"plant", strings.Repeat("x", 1<<20), "a\nb", "\x1b[2J", "nul\x00", "bad\xffutf8", strings.Repeat("y", MaxComponentBytes-len("route/"))} {
		dp := dps.AppendEmpty()
		dp.SetDoubleValue(1)
		dp.Attributes().PutStr("route", route)
	}
	pb, err := pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := Decode(pb, "application/x-protobuf")
	if err != nil {
		t.Fatal(err)
	}
	want := map[Key]float64{{"in_flight", "route/plant"}: 1, {"in_flight", "route/" + strings.Repeat("y", MaxComponentBytes-len("route/"))}: 1}
	if len(got) != len(want) {
		t.Fatalf("got %d series, want %d", len(got), len(want))
	}
	for k := range want {
		if _, ok := got[k]; !ok {
			t.Errorf("missing %.40s", k)
		}
	}
}

// A gauge of NaN or an infinity (or sums that overflow) is not kept: the
// batcher writes each row as JSON, which has no NaN, and the encoding
// error dropped the whole flush, every agent's samples with it.
func TestDecodeDropsNonFiniteValues(t *testing.T) {
	md := pmetric.NewMetrics()
	ms := md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics()
	g := ms.AppendEmpty()
	g.SetName("myriarch_bridge_messages_in_flight")
	dps := g.SetEmptyGauge().DataPoints()
	for route, v := range map[string]float64{"ok": 2, "nan": math.NaN(), "inf": math.Inf(1), "ninf": math.Inf(-1)} {
		dp := dps.AppendEmpty()
		dp.SetDoubleValue(v)
		dp.Attributes().PutStr("route", route)
	}
	for range 2 { // 2 × MaxFloat64 overflows to +Inf
		dp := dps.AppendEmpty()
		dp.SetDoubleValue(math.MaxFloat64)
		dp.Attributes().PutStr("route", "overflow")
	}
	pb, err := pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := Decode(pb, "application/x-protobuf")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[Key{"in_flight", "route/ok"}] != 2 {
		t.Fatalf("got %v, want only route/ok = 2", got)
	}
}

// What one agent sends cannot stop the flushes of every agent: a NUL in a
// component (PostgreSQL's jsonb refuses it: the one INSERT failed, and the
// rows were put back for the next flush, forever) or a NaN (the JSON
// encoding failed and the flush returned with every row dropped).
func TestOneAgentCannotPoisonTheFlush(t *testing.T) {
	ctx, st, _ := fleettest.LeaderStore(t, 6)
	clk := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	bt := NewBatcher(BatcherOptions{Pool: st.Pool, Tiers: DefaultTiers, FlushInterval: time.Hour, Now: clk.now})
	rd := &Reader{Pool: st.Pool, Tiers: DefaultTiers, Now: clk.now}
	body := func(route string, v float64) []byte {
		md := pmetric.NewMetrics()
		g := md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
		g.SetName("myriarch_bridge_messages_in_flight")
		dp := g.SetEmptyGauge().DataPoints().AppendEmpty()
		dp.SetDoubleValue(v)
		dp.Attributes().PutStr("route", route)
		pb, err := pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()
		if err != nil {
			t.Fatal(err)
		}
		return pb
	}
	for range 3 {
		for uid, b := range map[string][]byte{"good": body("r", 7), "nul": body("a\x00b", 1), "nan": body("r", math.NaN())} {
			s, _, err := Decode(b, "application/x-protobuf")
			if err != nil {
				t.Fatal(err)
			}
			bt.Add(uid, s)
		}
		if err := bt.Flush(ctx); err != nil {
			t.Fatalf("flush: %v", err)
		}
		clk.add(10 * time.Second)
	}
	w, err := rd.Agent(ctx, "good", 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Series) != 1 || len(w.Series[0].Points) == 0 {
		t.Fatalf("the good agent's series: %+v", w.Series)
	}
}
