package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/myriarch/myriarch/internal/pgtest"
)

// The measurement command runs end to end (with few agents, so that it is
// quick); the 10,000-agent figures in docs/myriarchd.md come from running
// it by hand.
func TestRolloutBenchCommand(t *testing.T) {
	pg := pgtest.New(t)
	var out, errb syncBuf
	code := commands.Dispatch([]string{"rollout-bench", "--agents", "30", "--bake", "0s", "--interval", "200ms", "--max-in-progress", "10",
		"--dsn", pg.DSN("")}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, out.String(), errb.String())
	}
	events := map[string]int{}
	for line := range strings.SplitSeq(strings.TrimSpace(out.String()), "\n") {
		var v map[string]any
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		events[v["event"].(string)]++
		if v["event"] == "planned" && !(v["plan_s"].(float64) > 0) {
			t.Errorf("plan_s: %v", v)
		}
	}
	if events["agents_connected"] != 1 || events["planned"] != 1 || events["wave"] != 4 || events["total"] != 1 {
		t.Fatalf("events %v:\n%s", events, out.String())
	}
}
