package docgen

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestDocsMatchCode fails when a generated table in docs/ differs from what
// the code computes: run `make docs` and commit.
func TestDocsMatchCode(t *testing.T) {
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(files) == 0 {
		t.Fatalf("no docs found: %v", err)
	}
	seen := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range Blocks(string(b)) {
			seen[n] = true
		}
		want, err := Update(string(b))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if want != string(b) {
			t.Errorf("%s: generated tables drifted from the code; run `make docs` and commit", f)
		}
	}
	for name := range Tables {
		if !seen[name] {
			t.Errorf("table %q is not used by any doc", name)
		}
	}
}

// The profile table reproduces the spec's figures.
func TestProfileTableHasSpecFigures(t *testing.T) {
	s, err := bridgeProfiles()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| 360s | 75.56s derived | 5s derived | 5s derived | 15s | 1097.5s | broker_health_step_down + 382.5s |",
		"| 45s | 10s | 3s | 5s derived | 5s | 336.5s | broker_health_step_down + 290s |"} {
		if !strings.Contains(s, want) {
			t.Errorf("profile table lacks %q:\n%s", want, s)
		}
	}
}

func TestUpdateRejectsUnknownAndMismatchedBlocks(t *testing.T) {
	if _, err := Update("<!-- generated:nope -->\nx\n<!-- /generated:nope -->"); err == nil {
		t.Fatal("unknown block accepted")
	}
	if _, err := Update("<!-- generated:leader-params -->\nx\n<!-- /generated:leader-budget -->"); err == nil {
		t.Fatal("mismatched block accepted")
	}
	got, err := Update("a\n<!-- generated:leader-params -->\nstale\n<!-- /generated:leader-params -->\nb")
	if err != nil || !strings.Contains(got, "| tcp_keepalives_count | D/I − 1 | 6 |") || strings.Contains(got, "stale") {
		t.Fatalf("update: %v\n%s", err, got)
	}
	if !slices.Equal(Blocks(got), []string{"leader-params"}) {
		t.Fatal(Blocks(got))
	}
}

// The queue-room table: rate × worst-case budget at the defaults.
func TestQueueRoomTable(t *testing.T) {
	s, err := bridgeQueueRoom()
	if err != nil {
		t.Fatal(err)
	}
	// Standalone: owner death 1097.5s is the worst; clustered: the broker
	// path, 60s + 290s = 350s.
	for _, want := range []string{"| 1097.5s | 10975 | 109750 | 219500 | 1097500 | 0.91 msg/s |", "| 350s | 3500 | 35000 | 70000 | 350000 | 2.85 msg/s |"} {
		if !strings.Contains(s, want) {
			t.Errorf("missing %q in\n%s", want, s)
		}
	}
}
