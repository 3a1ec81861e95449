package lab

import (
	"encoding/xml"
	"strings"
	"testing"
)

// The table and the plot show every run's owner_sigkill figures, and the
// plot is well-formed SVG.
func TestScaleTableAndPlot(t *testing.T) {
	reps := []*ScaleReport{
		{Store: StoreSQLite, LoadAvg: "1.0 1.0 1.0", Scenarios: []ScaleResult{
			{Scenario: OwnerSIGKILL, Sessions: 200, SessionsWithinBudget: 200, AllFullS: 9.5, SingleSessionFullS: 6, RSSPerSessionKB: 42, RenewCPUPct: 3.5},
			{Scenario: OwnerPlannedStop, Sessions: 200, SessionsWithinBudget: 200, AllFullS: 0.9}}},
		{Store: StoreSQLite, LoadAvg: "2.0 2.0 2.0", Scenarios: []ScaleResult{
			{Scenario: OwnerSIGKILL, Sessions: 20, SessionsWithinBudget: 20, AllFullS: 6.5, SingleSessionFullS: 6, RSSPerSessionKB: 60, RenewCPUPct: 0.5}}},
	}
	tab := ScaleTable(reps)
	for _, want := range []string{"| sqlite | 200 | owner_sigkill | 200/200 | 9.50 s |", "| sqlite | 200 | owner_planned_stop | 200/200 | 0.90 s |", "| 42 kB | 3.50 % |"} {
		if !strings.Contains(tab, want) {
			t.Errorf("table lacks %q:\n%s", want, tab)
		}
	}
	svg := ScaleSVG(reps)
	d := xml.NewDecoder(strings.NewReader(svg))
	circles := 0
	for {
		tok, err := d.Token()
		if err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("not XML: %v\n%s", err, svg)
			}
			break
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "circle" {
			circles++
		}
	}
	// Two runs × (herd, one session, memory, CPU).
	if circles != 8 || !strings.Contains(svg, "200 sessions") || !strings.Contains(svg, "1.0 1.0 1.0; 2.0 2.0 2.0") {
		t.Errorf("%d points, want 8:\n%s", circles, svg)
	}
}

// sumMetric adds the samples of one metric, labelled or not, and no
// other metric whose name it prefixes.
func TestSumMetric(t *testing.T) {
	text := `# HELP x
myriarch_lease_acquire_attempts_total{outcome="acquired"} 3
myriarch_lease_acquire_attempts_total{outcome="held"} 40
myriarch_lease_acquire_attempts_totalx 1000
myriarch_lease_renew_duration_seconds_count{outcome="ok"} 7
myriarch_lease_renew_duration_seconds_sum{outcome="ok"} 0.5
`
	if got := sumMetric(text, "myriarch_lease_acquire_attempts_total"); got != 43 {
		t.Errorf("acquire attempts %d, want 43", got)
	}
	if got := sumMetric(text, "myriarch_lease_renew_duration_seconds_count"); got != 7 {
		t.Errorf("renewals %d, want 7", got)
	}
}
