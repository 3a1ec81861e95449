package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/myriarch/myriarch/internal/pgtest"
)

// The telemetry command end to end at a small size (50 agents, a few
// intervals), so that it cannot rot: every field of the JSON is there and
// sane. The 10,000-agent figures in docs/myriarchd.md come from running it
// by hand. Without PostgreSQL it fails under CI=true (pgtest.New).
func TestTelemetryBenchCommand(t *testing.T) {
	pg := pgtest.New(t)
	bin := buildMyriarchd(t)
	var out, errb syncBuf
	code := commands.Dispatch([]string{"telemetry", "--agents", "50", "--interval", "1s", "--baseline", "2s", "--duration", "4s",
		"--settle", "1s", "--rate", "200", "--ui-requests", "3", "--seed-agents", "5", "--conns", "8",
		"--set", "telemetry.flushInterval=500ms", "--set", "telemetry.fineResolution=1s", "--set", "telemetry.coarseResolution=10s",
		"--set", "telemetry.fineRetention=1m",
		"--json", "--dsn", pg.DSN(""), "--myriarchd", bin, "--dir", t.TempDir()}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d:\n%s\n%s", code, out.String(), errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("want one JSON line, got %d:\n%s", len(lines), out.String())
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"agents", "online", "offered", "off", "on", "cpu_ratio", "requests", "rows_written", "rows_written_per_s",
		"table_bytes_end", "disk_bytes_per_row", "coarse_bytes_per_agent_per_day", "fine_bytes_per_agent_retained", "ui", "load_avg"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("field %q missing: %s", k, lines[0])
		}
	}
	var r telemetryResult
	if err := json.Unmarshal([]byte(lines[0]), &r); err != nil {
		t.Fatal(err)
	}
	check := func(ok bool, what string) {
		t.Helper()
		if !ok {
			t.Errorf("%s: %s\nprogress:\n%s", what, lines[0], errb.String())
		}
	}
	check(r.Agents == 50 && r.Online == 50 && r.Offered == 50, "every agent online with the own_metrics offer")
	check(r.SeriesPerAgent > 10 && r.MetricsPerBody > r.SeriesPerAgent/2 && r.BodyBytes > 1000, "a collector-like body")
	check(r.Requests > 0 && r.RequestErrors == 0, "requests sent, none failed")
	check(r.RowsWritten > 0 && r.RowsWrittenPerS > 0 && r.TableInsertsPerS > 0, "rows written")
	check(r.On.ReplicaCPUPct > 0 && r.Off.ReplicaCPUPct >= 0 && r.On.ReplicaRSSMB > 0 && r.Off.ReplicaRSSMB > 0, "replica CPU and RSS of both windows")
	check(r.On.WALBytesPerS > 0 && r.TableBytesEnd > 0 && r.DiskBytesPerRow > 0 && r.RowBytes["fine"] > 0 && r.RowBytes["coarse"] > 0, "storage figures")
	check(r.CoarseBytesPerAgentPerDay > 0 && r.CoarseBytesPerAgentRetained > r.CoarseBytesPerAgentPerDay, "per agent per day")
	check(len(r.On.LoadAvg) == 3 && len(r.Off.LoadAvg) == 3 && len(r.LoadAvg) == 3, "load averages")
	pages := map[string]pageTime{}
	for _, p := range r.UI {
		pages[p.Page] = p
	}
	for _, p := range []string{"overview", "agents", "agent", "api_agent_telemetry", "api_fleet_telemetry"} {
		check(pages[p].Requests == 3 && pages[p].MedianMS > 0 && pages[p].P99MS >= pages[p].MedianMS, "UI page "+p+" timed")
	}
	for _, p := range []string{"overview", "agents", "agent"} {
		check(pages[p].ServerMedianMS > 0 && pages[p].ServerP99MS >= pages[p].ServerMedianMS && pages[p].ServerMedianMS <= pages[p].MedianMS,
			"UI page "+p+": the replica's own time")
	}
	check(pages["agent"].SVGs > 0 && pages["agents"].SVGs > 0 && pages["overview"].SVGs > 0, "the pages have charts")
	check(len(r.Errors) == 0, "no errors")
}
