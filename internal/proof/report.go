package proof

import (
	"encoding/json"
	"fmt"
	"html/template"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// ScenarioStat is one (kind, scenario) over its rounds.
type ScenarioStat struct {
	Kind     string  `json:"kind"`
	Scenario string  `json:"scenario"`
	Rounds   int     `json:"rounds"`
	Passed   int     `json:"passed"`
	BudgetS  float64 `json:"budget_s"`
	P50S     float64 `json:"failure_to_full_p50_s"`
	P99S     float64 `json:"failure_to_full_p99_s"`
	MaxS     float64 `json:"failure_to_full_max_s"`
	MaxDup   int     `json:"max_duplicates"`
}

// StoreStat is one store over its rounds.
type StoreStat struct {
	Store      string  `json:"store"`
	Rounds     int     `json:"rounds"`
	Passed     int     `json:"passed"`
	Failed     int     `json:"failed"`
	Limit      int     `json:"known_limit"`
	Published  int     `json:"published"`
	Lost       int     `json:"lost"`
	Duplicates int     `json:"duplicates"`
	MaxDup     int     `json:"max_duplicates_per_round"`
	Stale      int     `json:"stale"`
	TwoOwners  int     `json:"two_owner_rounds"`
	OverBudget int     `json:"over_budget"`
	P50S       float64 `json:"failure_to_full_p50_s"`
	MaxS       float64 `json:"failure_to_full_max_s"`
}

// Summary is summary.json.
type Summary struct {
	Campaign  Campaign       `json:"campaign"`
	Final     Final          `json:"final"`
	Stores    []StoreStat    `json:"stores"`
	Scenarios []ScenarioStat `json:"scenarios"`
	Slowest   []Record       `json:"slowest"`
	// Load1P50 and Load1Max are the host's 1-minute load average over
	// the batches (each batch's at its end).
	Load1P50 float64  `json:"load1_p50"`
	Load1Max float64  `json:"load1_max"`
	Failed   []Record `json:"failed"`
}

func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// buildSummary builds summary.json's content.
func buildSummary(c Campaign, recs []Record, fin Final) Summary {
	sum := Summary{Campaign: c, Final: fin}
	byStore := map[string]*StoreStat{}
	ftfStore := map[string][]float64{}
	type key struct{ kind, sc string }
	bySc := map[key]*ScenarioStat{}
	ftfSc := map[key][]float64{}
	var ran []Record
	var loads []float64
	for _, r := range recs {
		loads = append(loads, r.Load1)
		if r.Verdict == Skipped {
			continue
		}
		ran = append(ran, r)
		st := byStore[r.Store]
		if st == nil {
			st = &StoreStat{Store: r.Store}
			byStore[r.Store] = st
		}
		st.Rounds++
		switch r.Verdict {
		case Pass:
			st.Passed++
		case Fail:
			st.Failed++
		case Limit:
			st.Limit++
		}
		st.Published += r.Published
		st.Lost += r.Lost
		st.Duplicates += r.Duplicates
		st.MaxDup = max(st.MaxDup, r.Duplicates)
		st.Stale += r.Stale
		if r.TwoOwners {
			st.TwoOwners++
		}
		if r.OverBudget {
			st.OverBudget++
		}
		k := key{r.Kind, r.Scenario}
		ss := bySc[k]
		if ss == nil {
			ss = &ScenarioStat{Kind: r.Kind, Scenario: r.Scenario}
			bySc[k] = ss
		}
		ss.Rounds++
		if r.Verdict == Pass {
			ss.Passed++
		}
		ss.BudgetS = max(ss.BudgetS, r.BudgetS)
		ss.MaxDup = max(ss.MaxDup, r.Duplicates)
		if r.FailureToFullS > 0 {
			ftfStore[r.Store] = append(ftfStore[r.Store], r.FailureToFullS)
			ftfSc[k] = append(ftfSc[k], r.FailureToFullS)
		}
		if r.Verdict != Pass {
			sum.Failed = append(sum.Failed, r)
		}
	}
	for _, s := range fin.Stores {
		if st := byStore[s]; st != nil {
			st.P50S, st.MaxS = quantile(ftfStore[s], 0.5), quantile(ftfStore[s], 1)
			sum.Stores = append(sum.Stores, *st)
		}
	}
	for k, ss := range bySc {
		ss.P50S, ss.P99S, ss.MaxS = quantile(ftfSc[k], 0.5), quantile(ftfSc[k], 0.99), quantile(ftfSc[k], 1)
		sum.Scenarios = append(sum.Scenarios, *ss)
	}
	sort.Slice(sum.Scenarios, func(i, j int) bool {
		a, b := sum.Scenarios[i], sum.Scenarios[j]
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		return a.Scenario < b.Scenario
	})
	sum.Load1P50, sum.Load1Max = quantile(loads, 0.5), quantile(loads, 1)
	sort.SliceStable(ran, func(i, j int) bool { return ratio(ran[i]) > ratio(ran[j]) })
	sum.Slowest = ran[:min(20, len(ran))]
	return sum
}

// ratio is failure-to-full over budget.
func ratio(r Record) float64 {
	if r.BudgetS <= 0 {
		return 0
	}
	return r.FailureToFullS / r.BudgetS
}

// WriteReport writes summary.json, the SVG plots and index.html.
func WriteReport(dir string, c Campaign, recs []Record, fin Final) error {
	sum := buildSummary(c, recs, fin)
	b, err := json.MarshalIndent(sum, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	plots := map[string]string{"failure-to-full.svg": PlotScenarios(recs), "duplicates.svg": PlotDuplicates(recs)}
	var hists []string
	for _, s := range fin.Stores {
		name := "histogram-" + s + ".svg"
		plots[name] = PlotHistogram(recs, s)
		hists = append(hists, name)
	}
	for name, svg := range plots {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(svg), 0o644); err != nil {
			return err
		}
	}
	finLine, _ := json.Marshal(fin)
	f, err := os.Create(filepath.Join(dir, "index.html"))
	if err != nil {
		return err
	}
	defer f.Close()
	return page.Execute(f, map[string]any{"S": sum, "Final": string(finLine), "Hists": hists})
}

var page = template.Must(template.New("index").Funcs(template.FuncMap{
	"f3":    func(v float64) string { return fmt.Sprintf("%.3f", v) },
	"ratio": func(r Record) string { return fmt.Sprintf("%.0f%%", 100*ratio(r)) },
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Myriarch proof campaign</title>
<style>body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:left}th{background:#f3f3f3}code{font-size:12px}.fail{color:#b00}img{max-width:100%;border:1px solid #eee;margin:.5em 0}</style></head><body>
<h1>Proof campaign</h1>
<p>Seed {{.S.Campaign.Seed}}, size {{.S.Campaign.Size.Name}}, stores {{.S.Campaign.Stores}}, leader rounds {{.S.Campaign.Leader}}, started {{.S.Campaign.Started.Format "2006-01-02 15:04 MST"}}{{with .S.Campaign.Revision}}, revision {{.}}{{end}}. {{.S.Final.Rounds}} of {{.S.Campaign.Rounds}} planned rounds recorded. Host load (1-minute average at each batch's end): median {{printf "%.1f" .S.Load1P50}}, max {{printf "%.1f" .S.Load1Max}}.</p>
<pre>{{.Final}}</pre>
<h2>Failed rounds ({{len .S.Failed}})</h2>
{{if .S.Failed}}<table><tr><th>seed</th><th>store</th><th>broker</th><th>scenario</th><th>verdict</th><th>load</th><th>cause</th><th>logs</th></tr>
{{range .S.Failed}}<tr><td><code>{{.Seed}}</code></td><td>{{.Store}}</td><td>{{.Broker}}</td><td>{{.Scenario}}</td><td class="fail">{{.Verdict}}</td><td>{{printf "%.1f" .Load1}}</td><td>{{.Cause}}</td><td>{{with .LogDir}}<a href="{{.}}/">{{.}}</a>{{end}}</td></tr>
{{end}}</table><p>Rerun one: <code>myriarch-lab proof --replay SEED --dir DIR</code>.</p>{{else}}<p>None.</p>{{end}}
<h2>Stores</h2>
<table><tr><th>store</th><th>rounds</th><th>passed</th><th>failed</th><th>known limit</th><th>published</th><th>lost</th><th>duplicates (max/round)</th><th>stale</th><th>two owners</th><th>over budget</th><th>failure-to-full p50 / max (s)</th></tr>
{{range .S.Stores}}<tr><td>{{.Store}}</td><td>{{.Rounds}}</td><td>{{.Passed}}</td><td>{{.Failed}}</td><td>{{.Limit}}</td><td>{{.Published}}</td><td>{{.Lost}}</td><td>{{.Duplicates}} ({{.MaxDup}})</td><td>{{.Stale}}</td><td>{{.TwoOwners}}</td><td>{{.OverBudget}}</td><td>{{f3 .P50S}} / {{f3 .MaxS}}</td></tr>
{{end}}</table>
<h2>Failure-to-full per scenario, against its budget</h2>
<p>Each dot is a round (colour: store); the red bar is the scenario's computed budget. Leader rounds plot the time to the new leader's term against pgleader's bound.</p>
<img src="failure-to-full.svg" alt="failure-to-full per scenario">
<table><tr><th>kind</th><th>scenario</th><th>rounds</th><th>passed</th><th>p50 (s)</th><th>p99 (s)</th><th>max (s)</th><th>budget (s)</th><th>max duplicates</th></tr>
{{range .S.Scenarios}}<tr><td>{{.Kind}}</td><td>{{.Scenario}}</td><td>{{.Rounds}}</td><td>{{.Passed}}</td><td>{{f3 .P50S}}</td><td>{{f3 .P99S}}</td><td>{{f3 .MaxS}}</td><td>{{f3 .BudgetS}}</td><td>{{.MaxDup}}</td></tr>
{{end}}</table>
<h2>Failure-to-full histogram per store</h2>
{{range .Hists}}<img src="{{.}}" alt="{{.}}">
{{end}}
<h2>Duplicates per round</h2>
<p>The declared bound is min(receive_maximum, max_in_flight) = 100 per fault.</p>
<img src="duplicates.svg" alt="duplicates per round">
<h2>Slowest rounds (by failure-to-full over budget)</h2>
<table><tr><th>seed</th><th>store</th><th>broker</th><th>scenario</th><th>failure-to-full (s)</th><th>budget (s)</th><th>of budget</th><th>verdict</th></tr>
{{range .S.Slowest}}<tr><td><code>{{.Seed}}</code></td><td>{{.Store}}</td><td>{{.Broker}}</td><td>{{.Scenario}}</td><td>{{f3 .FailureToFullS}}</td><td>{{f3 .BudgetS}}</td><td>{{ratio .}}</td><td>{{.Verdict}}</td></tr>
{{end}}</table>
<p>Every round is a line of <a href="rounds.jsonl">rounds.jsonl</a>; the figures above are in <a href="summary.json">summary.json</a>.</p>
</body></html>
`))

// Store colours of the plots.
var storeColour = map[string]string{"sqlite": "#1f77b4", "postgres": "#2ca02c", "etcd": "#ff7f0e", StoreLeader: "#9467bd"}

func colour(store string) string {
	if c, ok := storeColour[store]; ok {
		return c
	}
	return "#555"
}

// svgFrame is a plot area with axes.
type svgFrame struct {
	b           strings.Builder
	w, h        float64
	l, r, t, bt float64
	ymax        float64
}

func newFrame(w, h, ymax, bottom float64, title, ylabel string) *svgFrame {
	f := &svgFrame{w: w, h: h, l: 60, r: 20, t: 30, bt: bottom, ymax: niceCeil(ymax)}
	fmt.Fprintf(&f.b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="11">`+"\n", w, h, w, h)
	fmt.Fprintf(&f.b, `<rect width="100%%" height="100%%" fill="white"/><text x="%.0f" y="18" font-size="14">%s</text>`+"\n", f.l, esc(title))
	fmt.Fprintf(&f.b, `<text transform="translate(14,%.0f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", f.t+(h-f.t-f.bt)/2, esc(ylabel))
	for i := 0; i <= 5; i++ {
		v := f.ymax * float64(i) / 5
		y := f.y(v)
		fmt.Fprintf(&f.b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#eee"/><text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", f.l, w-f.r, y, y, f.l-4, y+4, trim(v))
	}
	fmt.Fprintf(&f.b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#333"/>`+"\n", f.l, f.l, f.t, h-f.bt)
	fmt.Fprintf(&f.b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#333"/>`+"\n", f.l, w-f.r, h-f.bt, h-f.bt)
	return f
}

func (f *svgFrame) y(v float64) float64 {
	if f.ymax <= 0 {
		return f.h - f.bt
	}
	return f.h - f.bt - (f.h-f.t-f.bt)*min(v, f.ymax)/f.ymax
}

func (f *svgFrame) pw() float64 { return f.w - f.l - f.r }

func (f *svgFrame) end() string {
	f.b.WriteString("</svg>\n")
	return f.b.String()
}

func (f *svgFrame) legend(stores []string) {
	x := f.l + 10
	for _, s := range stores {
		fmt.Fprintf(&f.b, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s"/><text x="%.1f" y="%.1f">%s</text>`+"\n", x, f.t+8, colour(s), x+7, f.t+12, esc(s))
		x += 20 + 7*float64(len(s))
	}
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}

func trim(v float64) string {
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "" || s == "-" {
		return "0"
	}
	return s
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func storesOf(recs []Record) []string {
	var out []string
	for _, s := range []string{"sqlite", "postgres", "etcd", StoreLeader} {
		for _, r := range recs {
			if r.Store == s {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// PlotScenarios draws failure-to-full per scenario (one column each,
// rounds as dots coloured by store) with the scenario's budget as a bar.
func PlotScenarios(recs []Record) string {
	type col struct {
		name   string
		budget float64
		rs     []Record
	}
	var cols []*col
	idx := map[string]*col{}
	ymax := 1.0
	for _, r := range recs {
		if r.Verdict == Skipped {
			continue
		}
		name := r.Scenario
		if r.Kind == KindLeader {
			name = "leader " + name
		}
		c := idx[name]
		if c == nil {
			c = &col{name: name}
			idx[name] = c
			cols = append(cols, c)
		}
		c.budget = max(c.budget, r.BudgetS)
		c.rs = append(c.rs, r)
		ymax = max(ymax, r.FailureToFullS, r.BudgetS)
	}
	sort.Slice(cols, func(i, j int) bool { return cols[i].name < cols[j].name })
	f := newFrame(math.Max(760, 80*float64(len(cols))+200), 520, ymax*1.05, 190, "Failure-to-full per scenario (s), budget in red", "seconds")
	f.legend(storesOf(recs))
	cw := f.pw() / math.Max(1, float64(len(cols)))
	for i, c := range cols {
		x0 := f.l + cw*float64(i)
		xc := x0 + cw/2
		for j, r := range c.rs {
			// Spread the dots over the column, deterministically.
			jx := (float64((j*7919)%97)/96 - 0.5) * cw * 0.6
			fill := colour(r.Store)
			stroke := "none"
			if r.Verdict != Pass {
				stroke = "#b00"
			}
			fmt.Fprintf(&f.b, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s" fill-opacity="0.6" stroke="%s"><title>seed %d %s %.3fs</title></circle>`+"\n", xc+jx, f.y(r.FailureToFullS), fill, stroke, r.Seed, r.Store, r.FailureToFullS)
		}
		by := f.y(c.budget)
		fmt.Fprintf(&f.b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#d00" stroke-width="2"/>`+"\n", x0+cw*0.1, x0+cw*0.9, by, by)
		fmt.Fprintf(&f.b, `<text transform="translate(%.1f,%.1f) rotate(45)">%s (%d)</text>`+"\n", xc-4, f.h-f.bt+12, esc(c.name), len(c.rs))
	}
	return f.end()
}

// PlotHistogram draws the failure-to-full histogram of one store.
func PlotHistogram(recs []Record, store string) string {
	var v []float64
	var budget float64
	for _, r := range recs {
		if r.Store == store && r.Verdict != Skipped && r.FailureToFullS > 0 {
			v = append(v, r.FailureToFullS)
			budget = max(budget, r.BudgetS)
		}
	}
	hi := niceCeil(quantile(v, 1) * 1.05)
	const bins = 40
	counts := make([]int, bins)
	for _, x := range v {
		counts[min(bins-1, int(x/hi*bins))]++
	}
	top := 1
	for _, c := range counts {
		top = max(top, c)
	}
	f := newFrame(640, 300, float64(max(top, 5)), 40, fmt.Sprintf("%s: failure-to-full histogram (%d rounds; largest budget %.1fs)", store, len(v), budget), "rounds")
	bw := f.pw() / bins
	for i, c := range counts {
		if c == 0 {
			continue
		}
		y := f.y(float64(c))
		fmt.Fprintf(&f.b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s–%ss: %d</title></rect>`+"\n", f.l+bw*float64(i)+0.5, y, bw-1, f.h-f.bt-y, colour(store), trim(hi*float64(i)/bins), trim(hi*float64(i+1)/bins), c)
	}
	for i := 0; i <= 4; i++ {
		x := f.l + f.pw()*float64(i)/4
		fmt.Fprintf(&f.b, `<text x="%.1f" y="%.1f" text-anchor="middle">%ss</text>`+"\n", x, f.h-f.bt+14, trim(hi*float64(i)/4))
	}
	return f.end()
}

// PlotDuplicates draws duplicates per bridge round in campaign order.
func PlotDuplicates(recs []Record) string {
	var rs []Record
	top := 1
	for _, r := range recs {
		if r.Kind == KindBridge && r.Verdict != Skipped {
			rs = append(rs, r)
			top = max(top, r.Duplicates)
		}
	}
	f := newFrame(900, 300, float64(max(top, 5)), 40, fmt.Sprintf("Duplicates per bridge round (%d rounds; bound 100 per fault)", len(rs)), "duplicates")
	f.legend(storesOf(rs))
	n := math.Max(1, float64(len(rs)))
	for i, r := range rs {
		x := f.l + f.pw()*(float64(i)+0.5)/n
		fmt.Fprintf(&f.b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="%.1f"><title>seed %d: %d</title></line>`+"\n", x, x, f.y(0), f.y(float64(r.Duplicates)), colour(r.Store), math.Max(1, f.pw()/n*0.8), r.Seed, r.Duplicates)
	}
	fmt.Fprintf(&f.b, `<text x="%.1f" y="%.1f" text-anchor="middle">round (campaign order)</text>`+"\n", f.l+f.pw()/2, f.h-f.bt+16)
	return f.end()
}
