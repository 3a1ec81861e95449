package daemon

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"

	"github.com/myriarch/myriarch/internal/fleet/api"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// otlpBody is an OTLP protobuf export of a collector's accepted spans
// (cumulative v) whose resource claims to be agent claimed.
func otlpBody(t *testing.T, claimed string, v int64, pad int) []byte {
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	rm.Resource().Attributes().PutStr("service.instance.id", claimed)
	rm.Resource().Attributes().PutStr("padding", strings.Repeat("x", pad))
	m := rm.ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	m.SetName("otelcol_receiver_accepted_spans")
	s := m.SetEmptySum()
	s.SetIsMonotonic(true)
	s.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
	dp := s.DataPoints().AppendEmpty()
	dp.SetIntValue(v)
	dp.Attributes().PutStr("receiver", "otlp")
	b, err := pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func postMetrics(t *testing.T, url, auth string, body []byte, ct string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
	if auth != "" {
		req.Header.Set("Authorization", "Bearer "+auth)
	}
	req.Header.Set("Content-Type", ct)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// The own-metrics endpoint (issue 27): an agent that reports its own
// metrics is offered the endpoint with its credential; only a credential
// writes, only its own series, whatever the body claims; a revoked agent,
// the enrollment secret and no credential are refused; a body over
// server.opampMaxMessageBytes is refused; the rates appear in the API.
func TestOwnMetricsEndpoint(t *testing.T) {
	pg := pgtest.New(t)
	d := start(t, testConfig(t, pg.DSN(""), "r1", map[string]string{"telemetry.flushInterval": "100ms",
		"server.opampMaxMessageBytes": "65536", "server.opampBodyBytesPerSource": "65536", "server.opampBodyBytesInFlight": "65536"}), nil)
	defer d.Shutdown()
	ctx := context.Background()
	opampURL := "ws://" + d.OpAMPAddr().String() + "/v1/opamp"
	agent := func(own bool) *fleettest.Agent {
		a, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: opampURL, Secret: secret, Credential: true, OwnMetrics: own})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Stop(context.Background()) })
		return a
	}
	a, b, plain := agent(true), agent(true), agent(false)
	if !fleettest.Eventually(30*time.Second, func() bool {
		return a.OwnMetrics() != nil && b.OwnMetrics() != nil && plain.Credential() != ""
	}) {
		t.Fatalf("no own_metrics offers: %v %v", a.OwnMetrics(), b.OwnMetrics())
	}
	want := "http://" + d.OpAMPAddr().String() + "/v1/metrics"
	om := a.OwnMetrics()
	if om.DestinationEndpoint != want || len(om.Headers.GetHeaders()) != 1 || om.Headers.Headers[0].Value != "Bearer "+a.Credential() {
		t.Fatalf("offer %v; want %s with the agent's credential %s", om, want, a.Credential())
	}
	if plain.OwnMetrics() != nil {
		t.Fatal("an agent that does not report its own metrics was offered a destination")
	}
	url, credA, credB := want, a.Credential(), b.Credential()
	uidA, uidB := a.UIDString(), b.UIDString()
	body := otlpBody(t, uidB, 1000, 0) // A claims to be B
	for what, c := range map[string]struct {
		auth string
		ct   string
		body []byte
		code int
	}{
		"no credential":     {"", "application/x-protobuf", body, 401},
		"enrollment secret": {secret, "application/x-protobuf", body, 401},
		"a wrong token":     {"myr_agent_nope", "application/x-protobuf", body, 401},
		"text/plain":        {credA, "text/plain", body, 415},
		"garbage":           {credA, "application/x-protobuf", []byte("\xff\xff\xff"), 400},
		"over the bound":    {credA, "application/x-protobuf", otlpBody(t, uidA, 1, 70000), 413},
	} {
		if got := postMetrics(t, url, c.auth, c.body, c.ct); got != c.code {
			t.Errorf("%s: %d, want %d", what, got, c.code)
		}
	}
	if got := postMetrics(t, url, credA, body, "application/x-protobuf"); got != 200 {
		t.Fatalf("A's credential: %d", got)
	}
	time.Sleep(10 * time.Second) // the next fine bucket
	if got := postMetrics(t, url, credA, otlpBody(t, uidB, 2000, 0), "application/x-protobuf"); got != 200 {
		t.Fatalf("A's credential: %d", got)
	}
	_, tok, err := d.Store.IssueToken(ctx, "viewer")
	if err != nil {
		t.Fatal(err)
	}
	c := client{"http://" + d.HTTPAddr().String(), tok}
	var got api.AgentTelemetry
	if !fleettest.Eventually(10*time.Second, func() bool {
		got = api.AgentTelemetry{}
		return c.do(t, "GET", "/api/v1/agents/"+uidA+"/telemetry?window=5m", "", &got) == 200 &&
			len(got.Series) == 1 && len(got.Series[0].Points) > 0
	}) {
		t.Fatalf("A's telemetry: %+v", got)
	}
	s := got.Series[0]
	if s.Name != "accepted.spans" || s.Component != "receiver/otlp" || s.Unit != "items/s" || s.Points[len(s.Points)-1][1] <= 0 {
		t.Fatalf("A's series %+v", s)
	}
	var gotB api.AgentTelemetry
	if c.do(t, "GET", "/api/v1/agents/"+uidB+"/telemetry?window=5m", "", &gotB) != 200 || len(gotB.Series) != 0 {
		t.Fatalf("B has series it never sent (A claimed to be B): %+v", gotB)
	}
	if code := c.do(t, "GET", "/api/v1/agents/"+uidA+"/telemetry?window=9000h", "", nil); code != 400 {
		t.Fatalf("a window past the retention: %d", code)
	}
	if _, err := d.Store.RevokeAgent(ctx, uidB, "test"); err != nil {
		t.Fatal(err)
	}
	if got := postMetrics(t, url, credB, otlpBody(t, uidB, 1, 0), "application/x-protobuf"); got != 401 {
		t.Fatalf("a revoked agent: %d, want 401", got)
	}
}
