package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/myriarch/myriarch/internal/pgtest"
)

// The measurement command runs end to end (with few agents, so that it is
// quick); the 10,000-agent figures in docs/myriarchd.md come from running
// it by hand.
func TestRolloutBenchCommand(t *testing.T) {
	pg := pgtest.New(t)
	bin := buildMyriarchd(t)
	var out, errb syncBuf
	code := commands.Dispatch([]string{"rollout-bench", "--agents", "30", "--bake", "0s", "--interval", "200ms", "--max-in-progress", "10",
		"--dsn", pg.DSN(""), "--myriarchd", bin}, &out, &errb)
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

// syncBuf is a bytes.Buffer safe for the command's goroutines and the test.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// buildMyriarchd builds the replica the measurement commands start.
func buildMyriarchd(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "myriarchd")
	if out, err := exec.Command("go", "build", "-o", bin, "../myriarchd").CombinedOutput(); err != nil {
		t.Fatalf("building myriarchd: %v\n%s", err, out)
	}
	return bin
}
