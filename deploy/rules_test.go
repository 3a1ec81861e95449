package deploy

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite prometheus/*.rules.yml from the charts")

// ruleFiles are the plain rule files: each chart's PrometheusRule with the
// series selected by the job label of a plain Prometheus scrape config.
var ruleFiles = []struct{ chart, file, set string }{
	{bridgeChartDir, "prometheus/myriarch-bridge.rules.yml", `prometheusRule: {enabled: true, selector: 'job="myriarch-bridge"'}`},
	{chartDir, "prometheus/myriarchd.rules.yml", `prometheusRule: {enabled: true, selector: 'job="myriarchd"'}`},
}

const ruleFileHeader = "# Generated from deploy/helm/%s/templates/prometheusrule.yaml with the\n" +
	"# chart's defaults by `go generate ./deploy`; do not edit. Thresholds that\n" +
	"# follow your configuration: render the chart with it (docs/operations.md).\n"

func renderRuleFile(t *testing.T, chart, set string) []byte {
	t.Helper()
	objs, err := renderDir(t, chart, set)
	if err != nil {
		t.Fatal(err)
	}
	spec := dig(t, objs["prometheusrule.yaml"], "spec")
	b, err := yaml.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte(strings.ReplaceAll(ruleFileHeader, "%s", filepath.Base(chart))), b...)
}

// The committed rule files are what the charts render.
func TestRuleFilesAreCurrent(t *testing.T) {
	for _, rf := range ruleFiles {
		want := renderRuleFile(t, rf.chart, rf.set)
		if *update {
			if err := os.WriteFile(rf.file, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(rf.file)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is not what the chart renders (run go generate ./deploy): %v", rf.file, err)
		}
	}
}

// promtool finds promtool (Debian's prometheus package). Under CI=true a
// missing promtool fails the test instead of skipping it.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not found (apt-get install prometheus); CI needs it")
		}
		t.Skip("promtool not found (apt-get install prometheus)")
	}
	return p
}

func runTool(t *testing.T, dir string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out)
}

// promtool accepts the rules of both charts, rendered with their defaults
// and with the settings that change thresholds, and the unit tests in
// prometheus/tests pass against the committed rule files.
func TestPromtoolRules(t *testing.T) {
	tool := promtool(t)
	dir := t.TempDir()
	var files []string
	for i, c := range []struct{ chart, set string }{
		{bridgeChartDir, "prometheusRule: {enabled: true}"},
		{bridgeChartDir, "prometheusRule: {enabled: true, failoverSLO: 90s, budget: 2m}"},
		{chartDir, "prometheusRule: {enabled: true}"},
		{chartDir, "prometheusRule: {enabled: true, rolloutStuckAfter: 1h, offlineFraction: 0.5}\nconfig: {ha: {leaderSessionTimeout: 1m30s}}"},
	} {
		f := filepath.Join(dir, filepath.Base(c.chart)+"-"+string(rune('a'+i))+".yml")
		if err := os.WriteFile(f, renderRuleFile(t, c.chart, c.set), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	for _, rf := range ruleFiles {
		files = append(files, rf.file)
	}
	out := runTool(t, ".", tool, append([]string{"check", "rules"}, files...)...)
	if strings.Count(out, "SUCCESS") != len(files) {
		t.Fatalf("promtool check rules:\n%s", out)
	}
	// promtool test rules compares every annotation of an alert; the
	// tests state the summaries and run on copies without the runbooks.
	tests, err := filepath.Glob("prometheus/tests/*.yml")
	if err != nil || len(tests) < 2 {
		t.Fatalf("rule tests %v %v", tests, err)
	}
	if err := os.Mkdir(filepath.Join(dir, "tests"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i, f := range tests {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		tests[i] = filepath.Join("tests", filepath.Base(f))
		if err := os.WriteFile(filepath.Join(dir, tests[i]), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, rf := range ruleFiles {
		b, err := os.ReadFile(rf.file)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Groups []struct {
				Name  string           `json:"name"`
				Rules []map[string]any `json:"rules"`
			} `json:"groups"`
		}
		if err := yaml.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		for _, g := range doc.Groups {
			for _, r := range g.Rules {
				if a, ok := r["annotations"].(map[string]any); ok {
					if rb, _ := a["runbook"].(string); len(rb) < 100 {
						t.Errorf("%s: alert %v has no runbook", rf.file, r["alert"])
					}
					delete(a, "runbook")
				}
			}
		}
		if b, err = yaml.Marshal(doc); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(rf.file)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out = runTool(t, dir, tool, append([]string{"test", "rules"}, tests...)...)
	if strings.Count(out, "SUCCESS") != len(tests) {
		t.Fatalf("promtool test rules:\n%s", out)
	}
}
