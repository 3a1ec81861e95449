package ui_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"

	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/fleet/ui"
)

// otlp is an OTLP protobuf export: cumulative sums and gauges of one
// attribute each (name → attribute key=value → value).
func otlp(t *testing.T, sums, gauges map[string][3]string) []byte {
	md := pmetric.NewMetrics()
	ms := md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics()
	for name, v := range sums {
		m := ms.AppendEmpty()
		m.SetName(name)
		s := m.SetEmptySum()
		s.SetIsMonotonic(true)
		s.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
		dp := s.DataPoints().AppendEmpty()
		f, _ := strconv.ParseFloat(v[2], 64)
		dp.SetDoubleValue(f)
		dp.Attributes().PutStr(v[0], v[1])
	}
	for name, v := range gauges {
		m := ms.AppendEmpty()
		m.SetName(name)
		dp := m.SetEmptyGauge().DataPoints().AppendEmpty()
		f, _ := strconv.ParseFloat(v[2], 64)
		dp.SetDoubleValue(f)
		dp.Attributes().PutStr(v[0], v[1])
	}
	b, err := pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTelemetryPicturesInHeadlessChromium: two agents send their own
// metrics through the real endpoint (a collector's accepted spans, a
// bridge's received messages and one takeover); the overview, the agents
// list and the agent pages show them as SVG whose elements carry the
// values; screenshots go to $MYRIARCH_SCREENSHOTS (default a temp dir).
func TestTelemetryPicturesInHeadlessChromium(t *testing.T) {
	browser := chromium(t)
	const secret = "0123456789abcdef-secret"
	d := startUI(t, "replica-tele", map[string]string{"ha.heartbeatInterval": "1s", "server.lastSeenFlushInterval": "200ms",
		"telemetry.flushInterval": "100ms", "telemetry.fineResolution": "1s", "telemetry.coarseResolution": "10s", "jobs.rolloutInterval": "100ms"})
	ctx := context.Background()
	tok, err := d.Store.CreateToken(ctx, "ui")
	if err != nil {
		t.Fatal(err)
	}
	opamp := "ws://" + d.OpAMPAddr().String() + "/v1/opamp"
	start := func(name string) *fleettest.Agent {
		a, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: opamp, Secret: secret, Credential: true, OwnMetrics: true,
			Attrs: map[string]string{"service.name": name, "role": "tele"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Stop(context.Background()) })
		return a
	}
	col, br := start("otelcol-test"), start("myriarch-bridge")
	if !fleettest.Eventually(30*time.Second, func() bool { return col.OwnMetrics() != nil && br.OwnMetrics() != nil && d.Elector.IsLeader() }) {
		t.Fatal("no own-metrics offers or no leader")
	}
	post := func(a *fleettest.Agent, body []byte) {
		om := a.OwnMetrics()
		req, _ := http.NewRequest("POST", om.DestinationEndpoint, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/x-protobuf")
		for _, h := range om.Headers.GetHeaders() {
			req.Header.Set(h.Key, h.Value)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("POST own metrics: %d", resp.StatusCode)
		}
	}
	// A configuration of both agents, rolled out in two waves (one agent
	// each, no bake) while they send.
	cs := configs.Service{Store: d.Store}
	if _, err := cs.Put(ctx, store.ConfigDef{Name: "tele", Type: configs.TypeYAML, Selector: map[string]string{"role": "tele"}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cs.AddRevision(ctx, "tele", "a: 1\n", "test", ""); err != nil {
		t.Fatal(err)
	}
	var ro rollout.Rollout
	// 200 spans/s and 50 messages/s for 25 s, one takeover of 1.5 s
	// (budget 12 s, SLO 60 s) and the rollout in the middle.
	for i := range 26 {
		if i == 10 {
			bake := 0.0
			if ro, err = (rollout.Service{Store: d.Store}).Create(ctx, rollout.Request{Config: "tele",
				Spec: rollout.Spec{Waves: []string{"1", "100%"}, BakeS: &bake}}, "test"); err != nil {
				t.Fatal(err)
			}
		}
		post(col, otlp(t, map[string][3]string{"otelcol_receiver_accepted_spans": {"receiver", "otlp", strconv.Itoa(200 * i)},
			"otelcol_exporter_sent_spans": {"exporter", "debug", strconv.Itoa(200 * i)}}, nil))
		g := map[string][3]string{"myriarch_bridge_failover_budget_seconds": {"session", "plant", "12"},
			"myriarch_bridge_failover_slo_seconds": {"session", "plant", "60"}, "myriarch_bridge_messages_in_flight": {"route", "r", "3"}}
		if i == 12 {
			g["myriarch_bridge_failover_failure_to_full_seconds"] = [3]string{"session", "plant", "1.5"}
		}
		post(br, otlp(t, map[string][3]string{"myriarch_bridge_messages_in": {"route", "r", strconv.Itoa(50 * i)},
			"myriarch_bridge_messages_out": {"route", "r", strconv.Itoa(50 * i)}}, g))
		time.Sleep(time.Second)
	}
	// The leader's job sums the fleet every coarse bucket (10 s).
	if !fleettest.Eventually(45*time.Second, func() bool {
		req, _ := http.NewRequest("GET", "http://"+d.HTTPAddr().String()+"/api/v1/telemetry?window=1h", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var w struct {
			Series []struct {
				Name   string       `json:"name"`
				Points [][2]float64 `json:"points"`
			} `json:"series"`
		}
		if json.NewDecoder(resp.Body).Decode(&w) != nil {
			return false
		}
		for _, s := range w.Series {
			if s.Name == "throughput" && len(s.Points) > 0 && s.Points[len(s.Points)-1][1] > 0 {
				return true
			}
		}
		return false
	}) {
		t.Fatal("no fleet throughput")
	}

	shots := os.Getenv("MYRIARCH_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	base := "http://" + d.HTTPAddr().String()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.WindowSize(1280, 1400),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-background-networking", true))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	bctx, tcancel := context.WithTimeout(bctx, 2*time.Minute)
	defer tcancel()
	q := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	do := func(steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			t.Fatal(err)
		}
	}
	attr := func(sel, name string) float64 {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.AttributeValue(q(sel), name))
		if err != nil || !v.Exists {
			t.Fatalf("%s[%s]: %v (exists %v)", sel, name, err, v.Exists)
		}
		f, err := strconv.ParseFloat(v.Value, 64)
		if err != nil {
			t.Fatalf("%s[%s] = %q", sel, name, v.Value)
		}
		return f
	}
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(shots, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	do(chromedp.Navigate(base+"/ui/login"), chromedp.WaitVisible(q("#login-form")),
		chromedp.SendKeys(q("#token"), tok), chromedp.Click(q("#login-submit")), chromedp.WaitVisible(q("#count-total")))

	// Overview: the fleet's throughput (250/s: 200 spans + 50 messages)
	// and agents over time, versions and configurations in use.
	do(chromedp.WaitVisible(q("#fleet-throughput")), chromedp.WaitVisible(q("#fleet-agents")), chromedp.WaitVisible(q("#fleet-configs")))
	if v := attr(`#fleet-throughput g.series[data-name="throughput"]`, "data-max"); v < 200 || v > 300 {
		t.Errorf("fleet throughput max %v, want about 250", v)
	}
	if v := attr(`#fleet-agents g.series[data-name="agents.online"]`, "data-last"); v != 2 {
		t.Errorf("agents online %v, want 2", v)
	}
	if v := attr(`#fleet-configs g.bar`, "data-value"); v != 2 {
		t.Errorf("configs in use: %v agents, want 2", v)
	}
	// Neither agent reports a package: counted as not reported.
	if v := attr(`#fleet-versions g.bar[data-label="`+ui.NotReported+`"]`, "data-value"); v != 2 {
		t.Errorf("versions in use: %v agents not reported, want 2", v)
	}
	shot("overview.png")

	// Agents list: a throughput sparkline per agent.
	do(chromedp.Navigate(base+"/ui/agents"), chromedp.WaitVisible(q("#agents svg.spark")))
	if v := attr(`tr.agent[data-uid="`+col.UIDString()+`"] svg.spark`, "data-last"); v < 150 || v > 250 {
		t.Errorf("collector sparkline last %v, want about 200", v)
	}
	if v := attr(`tr.agent[data-uid="`+br.UIDString()+`"] svg.spark`, "data-last"); v < 35 || v > 65 {
		t.Errorf("bridge sparkline last %v, want about 50", v)
	}
	shot("agents.png")

	// The collector's page: accepted and sent spans per second.
	do(chromedp.Navigate(base+"/ui/agents/"+col.UIDString()), chromedp.WaitVisible(q("#chart-throughput")))
	if v := attr(`#chart-throughput g.series[data-name="accepted.spans receiver/otlp"]`, "data-last"); v < 150 || v > 250 {
		t.Errorf("accepted spans %v/s, want about 200", v)
	}
	do(chromedp.WaitVisible(q(`#chart-sent g.series[data-name="sent.spans exporter/debug"]`)))
	shot("agent-collector.png")

	// The bridge's page: its route and its failover timeline.
	do(chromedp.Navigate(base+"/ui/agents/"+br.UIDString()), chromedp.WaitVisible(q("#chart-throughput")), chromedp.WaitVisible(q("#failover-plant")))
	if v := attr(`#failover-plant rect.takeover`, "data-failure-to-full"); v != 1.5 {
		t.Errorf("takeover failure-to-full %v, want 1.5", v)
	}
	if v := attr(`#failover-plant`, "data-budget"); v != 12 {
		t.Errorf("timeline budget %v, want 12", v)
	}
	if v := attr(`#failover-plant`, "data-slo"); v != 60 {
		t.Errorf("timeline SLO %v, want 60", v)
	}
	if v := attr(`#chart-inflight g.series`, "data-last"); v != 3 {
		t.Errorf("in flight %v, want 3", v)
	}
	// The timeline is a figure with its own caption, like the charts.
	do(chromedp.WaitVisible(q(`figure.timeline-box figcaption`)), chromedp.WaitVisible(q(`#failover-plant line.budget`)))
	shot("agent-bridge.png")

	// The rollout's page: its agents' throughput with each wave's start
	// marked, and per wave the mean before it started and after it
	// completed (each wave is one agent: its rate, 200 or 50 per second).
	rd, err := (rollout.Service{Store: d.Store}).Detail(ctx, ro.ID, 10)
	if err != nil || rd.State != rollout.StateSucceeded {
		t.Fatalf("rollout: %v %+v", err, rd)
	}
	do(chromedp.Navigate(fmt.Sprintf("%s/ui/rollouts/%d?refresh=0", base, ro.ID)), chromedp.WaitVisible(q("#rollout-throughput")),
		chromedp.WaitVisible(q("#wave-throughput")))
	if v := attr(`#rollout-throughput g.series[data-name="throughput"]`, "data-max"); v < 200 || v > 300 {
		t.Errorf("rollout throughput max %v, want about 250", v)
	}
	for wave := 1; wave <= 2; wave++ {
		row := fmt.Sprintf(`#wave-throughput tr.wave-throughput[data-wave="%d"]`, wave)
		before, after := attr(row, "data-before"), attr(row, "data-after")
		near := func(v float64) bool { return (v > 150 && v < 250) || (v > 35 && v < 65) }
		if !near(before) || !near(after) || math.Abs(before-after) > 0.3*math.Max(before, after) {
			t.Errorf("wave %d: %v/s before, %v/s after; want the rate of its agent (200 or 50) both times", wave, before, after)
		}
		mark := fmt.Sprintf(`#rollout-throughput g.mark[data-label="wave %d"]`, wave)
		// The mark's attributes have four significant digits.
		if b, a := attr(mark, "data-before"), attr(mark, "data-after"); math.Abs(b-before) > 0.001*before || math.Abs(a-after) > 0.001*after {
			t.Errorf("wave %d mark: %v before, %v after; the table says %v, %v", wave, b, a, before, after)
		}
		if at := attr(mark, "data-at"); at < float64(rd.CreatedAt.Unix()) {
			t.Errorf("wave %d marked at %v, before the rollout was created (%v)", wave, at, rd.CreatedAt.Unix())
		}
	}
	shot("rollout.png")
	t.Logf("screenshots in %s", shots)
}
