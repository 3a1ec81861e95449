package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"

	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// `myriarchd agent telemetry UID` and `myriarchd telemetry` through the
// REST API of a running replica: a real OpAMP agent sends its own metrics
// to the endpoint it was offered; the commands print its rate and the
// fleet's sums as a table, JSON and YAML; a bad window is refused before
// the API is called, one the replica refuses (beyond the coarse
// retention) names the rule and exits with 2, an unknown agent with 1.
func TestTelemetryCommands(t *testing.T) {
	pg := pgtest.New(t)
	d := inProcessReplica(t, pg.DSN(""), "replica-tele", map[string]string{"telemetry.flushInterval": "100ms",
		"telemetry.fineResolution": "1s", "telemetry.coarseResolution": "10s", "telemetry.coarseRetention": "1h", "telemetry.fineRetention": "10m"})
	ctx := context.Background()
	tok, err := d.Store.CreateToken(ctx, "cli")
	if err != nil {
		t.Fatal(err)
	}
	ag, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + d.OpAMPAddr().String() + "/v1/opamp", Secret: testSecret,
		Credential: true, OwnMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Stop(ctx)
	if !fleettest.Eventually(30*time.Second, func() bool { return ag.OwnMetrics() != nil }) {
		t.Fatal("no own_metrics offer")
	}
	uid := ag.UIDString()
	post := func(v int64) {
		md := pmetric.NewMetrics()
		m := md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
		m.SetName("otelcol_receiver_accepted_spans")
		s := m.SetEmptySum()
		s.SetIsMonotonic(true)
		s.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
		dp := s.DataPoints().AppendEmpty()
		dp.SetIntValue(v)
		dp.Attributes().PutStr("receiver", "otlp")
		body, err := pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()
		if err != nil {
			t.Fatal(err)
		}
		om := ag.OwnMetrics()
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
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST own metrics: %d", resp.StatusCode)
		}
	}
	t.Setenv("MYRIARCH_TOKEN", tok)
	t.Setenv("MYRIARCH_SERVER", "http://"+d.HTTPAddr().String())
	run := func(args ...string) (string, string, int) {
		var out, errb syncBuf
		code := commands.Dispatch(args, &out, &errb)
		return out.String(), errb.String(), code
	}

	// Before any sample: the table says so.
	if out, errOut, code := run("agent", "telemetry", uid); code != 0 || !strings.Contains(out, "no own metrics in this window") {
		t.Fatalf("before: %d %q %q", code, out, errOut)
	}
	// 100 spans per second for a few seconds.
	for i := range 5 {
		post(int64(100 * i))
		time.Sleep(time.Second)
	}
	var out, errOut string
	var code int
	if !fleettest.Eventually(30*time.Second, func() bool {
		out, errOut, code = run("agent", "telemetry", uid, "--window", "1m")
		return code == 0 && strings.Contains(out, "accepted.spans") && strings.Contains(out, "receiver/otlp")
	}) {
		t.Fatalf("agent telemetry: %d %q %q", code, out, errOut)
	}
	for _, want := range []string{"agent " + uid + ": window 1m, resolution 1s", "SERIES", "items/s"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	out, errOut, code = run("agent", "telemetry", uid, "-o", "json", "--window", "1m")
	var aw struct {
		UID    string  `json:"instance_uid"`
		Window float64 `json:"window_s"`
		Series []struct {
			Name   string       `json:"name"`
			Points [][2]float64 `json:"points"`
		} `json:"series"`
	}
	if err := json.Unmarshal([]byte(out), &aw); code != 0 || err != nil || aw.UID != uid || aw.Window != 60 || len(aw.Series) != 1 {
		t.Fatalf("json: %d %v %q %q", code, err, out, errOut)
	}
	for _, p := range aw.Series[0].Points {
		if p[1] < 50 || p[1] > 200 {
			t.Errorf("accepted spans %v/s, want about 100: %v", p[1], aw.Series[0].Points)
		}
	}
	if out, _, code = run("agent", "telemetry", uid, "-o", "yaml"); code != 0 || !strings.Contains(out, "instance_uid: "+uid) || !strings.Contains(out, "window_s: 300") {
		t.Fatalf("yaml (default window 5m): %d %q", code, out)
	}

	// The fleet view: every series of the fleet, default window 1h.
	if out, errOut, code = run("telemetry"); code != 0 || !strings.Contains(out, "fleet: window 1h, resolution 10s") {
		t.Fatalf("telemetry: %d %q %q", code, out, errOut)
	}
	if !fleettest.Eventually(45*time.Second, func() bool {
		out, errOut, code = run("telemetry", "--window", "10m")
		return code == 0 && strings.Contains(out, "agents.online") && !strings.Contains(out, "no fleet sums")
	}) {
		t.Fatalf("telemetry: %d %q %q", code, out, errOut)
	}
	if out, _, code = run("telemetry", "-o", "json"); code != 0 || !strings.Contains(out, `"name": "throughput"`) {
		t.Fatalf("telemetry json: %d %q", code, out)
	}

	// Refusals: the flag's syntax here, the window's range by the
	// replica (400: exit 2), an unknown agent (404: exit 1).
	if _, errOut, code = run("agent", "telemetry", uid, "--window", "soon"); code != 2 || !strings.Contains(errOut, `--window "soon": must be a duration`) {
		t.Errorf("bad window: %d %q", code, errOut)
	}
	if _, errOut, code = run("telemetry", "--window", "2h"); code != 2 || !strings.Contains(errOut, "telemetry.coarseRetention") || !strings.Contains(errOut, "HTTP 400") {
		t.Errorf("window beyond the retention: %d %q", code, errOut)
	}
	if _, errOut, code = run("agent", "telemetry", "00000000-0000-4000-8000-0000000000ff"); code != 1 || !strings.Contains(errOut, "HTTP 404") {
		t.Errorf("unknown agent: %d %q", code, errOut)
	}
	if _, errOut, code = run("agent", "telemetry"); code != 2 || !strings.Contains(errOut, "takes UID") {
		t.Errorf("no uid: %d %q", code, errOut)
	}
}
