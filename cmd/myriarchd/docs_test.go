package main

import (
	"os"
	"strings"
	"testing"
)

// The operator's guide lists every API command with its endpoint, and
// shows no command line that the CLI no longer takes.
func TestDocsListEveryCommand(t *testing.T) {
	b, err := os.ReadFile("../../docs/myriarchd.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, c := range apiCommands {
		line := "`myriarchd " + strings.TrimSpace(c.group+" "+c.name)
		alt := strings.Contains(c.name, "-") && strings.Contains(doc, "`myriarchd "+c.group+" "+strings.SplitN(c.name, "-", 2)[0]+"-") // rollout-pause|...
		if !strings.Contains(doc, line) && !strings.Contains(doc, "|"+c.name) && !strings.Contains(doc, "\\|"+c.name) && !alt {
			t.Errorf("docs/myriarchd.md does not show %s`", line)
		}
	}
	for _, gone := range []string{"rollout create --config", "--config-file", "MYRIARCH_DATABASE_URL=<url> go run ./cmd/myriarchd token create"} {
		if strings.Contains(doc, gone) {
			t.Errorf("docs/myriarchd.md still shows %q", gone)
		}
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(readme), "MYRIARCH_DATABASE_URL=<url> go run ./cmd/myriarchd token") {
		t.Error("README.md creates tokens in the database")
	}
}
