package configs

import (
	"os/exec"
	"strings"
	"testing"
)

// The fleet does not import the bridge, directly or through another
// package, tests included: the bridge's check reaches this package as a
// Validator that cmd/myriarchd registers (docs/architecture.md).
func TestFleetDoesNotImportTheBridge(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command("go", "list", "-deps", "-test", "github.com/myriarch/myriarch/internal/fleet/...").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "github.com/myriarch/myriarch/internal/bridge/") {
			t.Errorf("internal/fleet/... depends on %s", p)
		}
	}
}
