package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// run refuses an invalid file before opening anything, with exit 2 and
// every problem on stderr.
func TestRunRefusesInvalidConfig(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(p, []byte("bridge: {id: x, shutdown_timeout: soon}\nsessions: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := commands.Dispatch([]string{"-c", p}, &out, &errb) // run is the default command
	if code != 2 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{`bridge.shutdown_timeout: "soon": must be a Go duration`, "sessions: at least one session is required", "routes: at least one route is required"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errb.String())
		}
	}
}
