package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/myriarch/myriarch/internal/pgtest"
)

// The measurement command runs end to end with a small artifact and few
// agents; the figures in docs/myriarchd.md come from running it by hand.
func TestArtifactBenchCommand(t *testing.T) {
	for _, store := range []string{"postgres", "s3"} {
		t.Run(store, func(t *testing.T) { artifactBenchRun(t, store) })
	}
}

func artifactBenchRun(t *testing.T, store string) {
	pg := pgtest.New(t)
	var out, errb syncBuf
	code := commands.Dispatch([]string{"artifact-bench", "--size", "2", "--agents", "10", "--serve-size", "1", "--dsn", pg.DSN(""),
		"--store", store, "--myriarchd", buildMyriarchd(t)}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, out.String(), errb.String())
	}
	events := map[string]map[string]any{}
	for line := range strings.SplitSeq(strings.TrimSpace(out.String()), "\n") {
		var v map[string]any
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		events[v["event"].(string)] = v
	}
	p, s := events["prefetch"], events["serve"]
	if p == nil || s == nil || p["bytes"].(float64) != 2<<20 || !(p["mib_per_s"].(float64) > 0) || !strings.HasPrefix(p["store"].(string), store) ||
		s["failures"].(float64) != 0 || s["total_gib"].(float64) != 10.0/1024 {
		t.Fatalf("events: %v", events)
	}
}
