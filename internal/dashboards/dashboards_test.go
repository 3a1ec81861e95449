package dashboards

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const repo = "../.."

// exported collects the metric names the daemons register: the Name of
// every prometheus *Opts in the code, the name of every prometheus.NewDesc
// (collectors that read the database) and the Metric* constants of lease
// and pgleader.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	re := regexp.MustCompile(`(?:Name:\s*|Metric\w*\s*=\s*|prometheus\.NewDesc\(\s*)"(myriarch_[a-z0-9_]+)"`)
	names := map[string]bool{}
	for _, dir := range []string{"internal", "lease", "pgleader", "cmd"} {
		err := filepath.WalkDir(filepath.Join(repo, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") || strings.Contains(p, "internal/dashboards") {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, m := range re.FindAllSubmatch(b, -1) {
				names[string(m[1])] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if !names["myriarch_bridge_messages_in_total"] || !names["myriarch_leader"] || !names["myriarch_lease_is_owner"] {
		t.Fatalf("the scan found too little: %v", names)
	}
	return names
}

var metricRef = regexp.MustCompile(`\bmyriarch_[a-z0-9_]+`)

// unknown returns the metric names in expr that the code does not export.
func unknown(expr string, names map[string]bool) []string {
	var out []string
	for _, m := range metricRef.FindAllString(expr, -1) {
		base := m
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(m, suf); ok && names[b] {
				base = b
			}
		}
		if !names[base] {
			out = append(out, m)
		}
	}
	return out
}

type panel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// The committed JSON is what the code generates.
func TestDashboardsAreCurrent(t *testing.T) {
	for _, d := range All {
		db, err := d.Build()
		if err != nil {
			t.Fatalf("%s: %v", d.File, err)
		}
		want, err := JSON(db)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(repo, "deploy/grafana", d.File))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("deploy/grafana/%s is not what internal/dashboards generates (go generate ./internal/dashboards): %v", d.File, err)
		}
	}
}

// Every panel of the committed dashboards has queries, and every query
// names a metric, each one the daemons actually export.
func TestEveryPanelQueriesAnExportedMetric(t *testing.T) {
	names := exported(t)
	used := map[string]bool{}
	for _, d := range All {
		b, err := os.ReadFile(filepath.Join(repo, "deploy/grafana", d.File))
		if err != nil {
			t.Fatal(err)
		}
		var db struct {
			Panels []panel `json:"panels"`
		}
		if err := json.Unmarshal(b, &db); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, p := range db.Panels {
			if p.Type == "row" {
				continue
			}
			n++
			if len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", d.File, p.Title)
			}
			metrics := 0
			for _, tg := range p.Targets {
				if u := unknown(tg.Expr, names); len(u) > 0 {
					t.Errorf("%s: panel %q: %v not exported by the daemons: %s", d.File, p.Title, u, tg.Expr)
				}
				for _, m := range metricRef.FindAllString(tg.Expr, -1) {
					used[m] = true
					metrics++
				}
			}
			if metrics == 0 {
				t.Errorf("%s: panel %q names no metric", d.File, p.Title)
			}
		}
		if n < 8 {
			t.Errorf("%s: %d panels", d.File, n)
		}
	}
	// The check bites: a misspelt name is caught.
	if u := unknown("rate(myriarch_bridge_messages_in_totl[5m])", names); len(u) != 1 {
		t.Fatalf("a misspelt metric passed: %v", u)
	}
}

// The alert rules name exported metrics too.
func TestAlertRulesQueryExportedMetrics(t *testing.T) {
	names := exported(t)
	files, _ := filepath.Glob(filepath.Join(repo, "deploy/prometheus/*.rules.yml"))
	if len(files) != 2 {
		t.Fatalf("rule files %v", files)
	}
	var alerts []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Groups []struct {
				Rules []struct {
					Alert string `json:"alert"`
					Expr  string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		}
		if err := yaml.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		for _, g := range doc.Groups {
			for _, r := range g.Rules {
				alerts = append(alerts, r.Alert)
				if u := unknown(r.Expr, names); len(u) > 0 || !metricRef.MatchString(r.Expr) {
					t.Errorf("%s: alert %s: %v not exported: %s", filepath.Base(f), r.Alert, u, r.Expr)
				}
			}
		}
	}
	sort.Strings(alerts)
	if len(alerts) < 12 {
		t.Errorf("alerts %v", alerts)
	}
}
