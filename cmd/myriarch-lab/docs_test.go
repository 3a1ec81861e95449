package main

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/lab"
)

// The lab budgets quoted in docs/bridge.md come from the lab's config.
func TestDocsQuoteLabBudgets(t *testing.T) {
	doc, err := os.ReadFile("../../docs/bridge.md")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("lab.yaml", []byte(lab.RenderConfig(t.TempDir())))
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Exclusive[0].Assessment
	for _, want := range []string{
		fmt.Sprintf("%.3fs\n(owner death)", a.OwnerDeath.Total.Seconds()),
		fmt.Sprintf("%.3fs (broker path)", a.BrokerPath.Total.Seconds()),
		fmt.Sprintf("| owner_sigkill | %.3f |", a.OwnerDeath.Total.Seconds()),
		fmt.Sprintf("| owner_broker_path_blackhole | %.3f |", a.BrokerPath.Total.Seconds()),
	} {
		if !strings.Contains(string(doc), want) {
			t.Errorf("docs/bridge.md does not say %q", want)
		}
	}
}
