package otelagent_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	fleetapi "github.com/myriarch/myriarch/internal/fleet/api"
	"github.com/myriarch/myriarch/internal/fleet/config"
	"github.com/myriarch/myriarch/internal/fleet/daemon"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/otelagent"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// TestRealCollectorOwnMetrics is issue 27's end-to-end test for the
// OpenTelemetry supervisor and collector: myriarchd offers the
// supervisor (which reports its own metrics) the OTLP/HTTP destination
// with its credential; the supervisor configures its collector's own
// telemetry to push there; spans sent to the collector's OTLP receiver
// appear as the accepted.spans rate of receiver/otlp in the agent's
// telemetry within a few send intervals.
func TestRealCollectorOwnMetrics(t *testing.T) {
	otelagent.Binaries(t)
	pg := pgtest.New(t)
	cfg, err := config.Load(config.Source{Environ: []string{}, Overrides: map[string]string{
		"database.url": pg.DSN(""), "server.enrollmentSecret": secret, "ha.replicaId": "own-metrics",
		"server.opampListen": "127.0.0.1:0", "server.httpListen": "127.0.0.1:0", "server.lastSeenFlushInterval": "200ms",
		"telemetry.flushInterval": "200ms", "telemetry.fineResolution": "2s",
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := daemon.Start(ctx, daemon.Options{Config: cfg, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Version: "otel-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Shutdown()
	tok, err := d.Store.CreateToken(context.Background(), "otel-test")
	if err != nil {
		t.Fatal(err)
	}
	c := api{t: t, base: "http://" + d.HTTPAddr().String(), token: tok}
	sup := otelagent.Start(t, "ws://"+d.OpAMPAddr().String()+"/v1/opamp", otelagent.Options{Secret: secret, OwnMetrics: true})
	uid := sup.InstanceUID()
	c.until("registered", uid, func(dt detail) bool { return dt.Agent.Status == "online" && dt.Agent.Healthy != nil })
	port := otelagent.FreePort(t)
	hash := c.setConfig(uid, otelagent.PipelineConfig(port))
	c.until("applied the pipeline", uid, func(dt detail) bool {
		return dt.Agent.RemoteConfigStatus == "applied" && dt.Agent.RemoteConfigHash == hash
	})
	// Spans into the collector, all along.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		body := `{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"x","kind":1,"startTimeUnixNano":"1","endTimeUnixNano":"2"}]}]}]}`
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/traces", port), "application/json", strings.NewReader(body))
			if err == nil {
				resp.Body.Close()
			}
		}
	}()
	defer func() { close(stop); <-done }()
	var got fleetapi.AgentTelemetry
	var rate float64
	if !fleettest.Eventually(120*time.Second, func() bool {
		got = fleetapi.AgentTelemetry{}
		if c.call("GET", "/api/v1/agents/"+uid+"/telemetry?window=5m", "", &got) != http.StatusOK {
			return false
		}
		for _, s := range got.Series {
			if s.Name == "accepted.spans" && s.Component == "receiver/otlp" && len(s.Points) > 0 {
				rate = s.Points[len(s.Points)-1][1]
				return rate > 0
			}
		}
		return false
	}) {
		t.Fatalf("no accepted.spans rate of receiver/otlp in the agent's telemetry: %+v\nsupervisor log:\n%s\ncollector log:\n%s", got, tail(sup.Log()), sup.CollectorLog())
	}
	t.Logf("collector %s: receiver/otlp accepted %.1f spans/s; series %d", uid, rate, len(got.Series))
}

func tail(s string) string {
	if len(s) > 4000 {
		return s[len(s)-4000:]
	}
	return s
}
