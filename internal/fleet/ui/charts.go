package ui

import (
	"bytes"
	"fmt"
	"html/template"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/telemetry"
)

// Charts
//
// Every picture of the UI is SVG written on the server by the templates
// below (no script, no network): a line chart with its axes, a sparkline,
// a bar list and the bridges' failover timeline. Each element carries its
// values as data attributes and a <title> (a tooltip), so that a test (and
// a screen reader) reads what is drawn.

// chartLine is one line of a chart.
type chartLine struct {
	Name   string
	Class  string
	Points [][2]float64
}

// Chart is a line chart.
type Chart struct {
	ID, Title, Unit string
	Lines           []chartLine
	// From and To bound the time axis (unix seconds); zero: the points'.
	From, To float64
}

const chartW, chartH, padL, padB, padT = 560.0, 160.0, 48.0, 20.0, 8.0

var svgTmpl = template.Must(template.New("svg").Funcs(template.FuncMap{"f": func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) },
	"g": func(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) }}).Parse(`
{{define "chart"}}<figure class="chart-box"><figcaption>{{.Title}}{{with .Unit}} <span class="unit">({{.}})</span>{{end}}</figcaption>
<svg class="chart" id="{{.ID}}" viewBox="0 0 {{f .W}} {{f .H}}" width="{{f .W}}" height="{{f .H}}" role="img" data-unit="{{.Unit}}" data-max="{{g .Max}}" data-from="{{g .From}}" data-to="{{g .To}}">
<title>{{.Title}}</title>
<rect class="plot" x="{{f .X0}}" y="{{f .Y0}}" width="{{f .PW}}" height="{{f .PH}}"/>
<text class="axis" x="{{f .LX}}" y="{{f .Y0}}" dy="0.8em" text-anchor="end">{{g .Max}}</text>
<text class="axis" x="{{f .LX}}" y="{{f .Y1}}" text-anchor="end">0</text>
<text class="axis" x="{{f .X0}}" y="{{f .H}}">{{.FromLabel}}</text>
<text class="axis" x="{{f .X1}}" y="{{f .H}}" text-anchor="end">{{.ToLabel}}</text>
{{range .Lines}}<g class="series {{.Class}}" data-name="{{.Name}}" data-points="{{.N}}" data-last="{{g .Last}}" data-max="{{g .LMax}}"><title>{{.Name}}: last {{g .Last}}, max {{g .LMax}}</title>{{if .Path}}<polyline points="{{.Path}}"/>{{end}}</g>
{{end}}{{range .Marks}}<g class="mark" data-label="{{.Label}}" data-at="{{g .At}}" data-before="{{g .Before}}" data-after="{{g .After}}"><title>{{.Label}} started {{.Clock}}: {{g .Before}}/s before, {{g .After}}/s after</title><line x1="{{f .X}}" x2="{{f .X}}" y1="{{f $.Y0}}" y2="{{f $.Y1}}"/><text class="axis" x="{{f .X}}" y="{{f .LY}}" dx="{{f .DX}}" text-anchor="{{.Anchor}}">{{.Label}}</text></g>
{{end}}{{if not .Lines}}<text class="empty" x="{{f .MX}}" y="{{f .MY}}" text-anchor="middle">no data yet</text>{{end}}
</svg>
<ul class="legend">{{range .Lines}}<li class="{{.Class}}">{{.Name}}</li>{{end}}</ul></figure>{{end}}
{{define "spark"}}<svg class="spark" viewBox="0 0 120 24" width="120" height="24" data-last="{{g .Last}}" data-max="{{g .Max}}" data-points="{{.N}}"><title>{{.Title}}</title>{{if .Path}}<polyline points="{{.Path}}"/>{{end}}</svg>{{end}}
{{define "bars"}}<svg class="bars" id="{{.ID}}" viewBox="0 0 {{f .W}} {{f .H}}" width="{{f .W}}" height="{{f .H}}" role="img"><title>{{.Title}}</title>
{{range .Bars}}<g class="bar" data-label="{{.Label}}" data-value="{{g .Value}}"><title>{{.Label}}: {{g .Value}}</title><text x="0" y="{{f .TY}}">{{.Label}}</text><rect x="{{f .X}}" y="{{f .Y}}" width="{{f .BW}}" height="14"/><text x="{{f .VX}}" y="{{f .TY}}">{{g .Value}}</text></g>
{{end}}</svg>{{end}}
{{define "timeline"}}<figure class="chart-box timeline-box"><figcaption>{{.Title}} <span class="unit">(each takeover's failure-to-full against the budget and SLO, s)</span></figcaption>
<svg class="timeline" id="{{.ID}}" viewBox="0 0 {{f .W}} {{f .H}}" width="{{f .W}}" height="{{f .H}}" role="img" data-budget="{{g .Budget}}" data-slo="{{g .SLO}}" data-takeovers="{{len .Marks}}">
<title>{{.Title}}</title>
<rect class="plot" x="{{f .X0}}" y="{{f .Y0}}" width="{{f .PW}}" height="{{f .PH}}"/>
{{if .Budget}}<line class="budget" x1="{{f .X0}}" x2="{{f .X1}}" y1="{{f .BudgetY}}" y2="{{f .BudgetY}}"><title>owner-death budget {{g .Budget}} s</title></line><text class="axis" x="{{f .RX}}" y="{{f .BudgetY}}" dy="-2" text-anchor="end">budget {{g .Budget}} s</text>{{end}}
{{if .SLO}}<line class="slo" x1="{{f .X0}}" x2="{{f .X1}}" y1="{{f .SLOY}}" y2="{{f .SLOY}}"><title>failover SLO {{g .SLO}} s</title></line><text class="axis" x="{{f .RX}}" y="{{f .SLOY}}" dy="-2" text-anchor="end">SLO {{g .SLO}} s</text>{{end}}
<text class="axis" x="{{f .LX}}" y="{{f .Y0}}" dy="0.8em" text-anchor="end">{{g .Top}}</text><text class="axis" x="{{f .LX}}" y="{{f .Y1}}" text-anchor="end">0</text>
{{range .Marks}}<rect class="takeover{{if .Over}} over{{end}}" x="{{f .X}}" y="{{f .Y}}" width="6" height="{{f .BH}}" data-at="{{g .At}}" data-failure-to-full="{{g .Value}}" data-budget="{{g $.Budget}}" data-slo="{{g $.SLO}}"><title>takeover at {{.Label}}: failure-to-full {{g .Value}} s (budget {{g $.Budget}} s, SLO {{g $.SLO}} s)</title></rect>
{{end}}{{if not .Marks}}<text class="empty" x="{{f .MX}}" y="{{f .MY}}" text-anchor="middle">no takeover in the window</text>{{end}}
<text class="axis" x="{{f .X0}}" y="{{f .H}}">{{.FromLabel}}</text><text class="axis" x="{{f .X1}}" y="{{f .H}}" text-anchor="end">{{.ToLabel}}</text>
</svg></figure>{{end}}`))

func execSVG(name string, data any) template.HTML {
	var b bytes.Buffer
	if err := svgTmpl.ExecuteTemplate(&b, name, data); err != nil {
		return template.HTML("<!-- " + template.HTMLEscapeString(err.Error()) + " -->")
	}
	return template.HTML(b.String()) // #nosec: the template escaped every value
}

type frame struct {
	W, H, X0, Y0, X1, Y1, PW, PH, LX, MX, MY float64
	From, To                                 float64
	FromLabel, ToLabel                       string
}

func newFrame(w, h, from, to float64) frame {
	f := frame{W: w, H: h, X0: padL, Y0: padT, X1: w - 4, Y1: h - padB, LX: padL - 4, From: from, To: to}
	f.PW, f.PH = f.X1-f.X0, f.Y1-f.Y0
	f.MX, f.MY = f.X0+f.PW/2, f.Y0+f.PH/2
	f.FromLabel, f.ToLabel = clock(from), clock(to)
	return f
}

func clock(unix float64) string {
	if unix == 0 {
		return ""
	}
	return time.Unix(int64(unix), 0).UTC().Format("15:04Z")
}

func (f frame) x(t float64) float64 {
	if f.To <= f.From {
		return f.X0
	}
	return f.X0 + (t-f.From)/(f.To-f.From)*f.PW
}

func (f frame) y(v, max float64) float64 {
	if max <= 0 {
		return f.Y1
	}
	return f.Y1 - v/max*f.PH
}

// chartMark is a vertical mark on a chart (a rollout wave's start).
type chartMark struct {
	At            float64
	Label         string
	Before, After float64
}

// Render writes the chart as SVG.
func (c Chart) Render() template.HTML { return c.RenderWithMarks(nil) }

// RenderWithMarks writes the chart as SVG with vertical marks.
func (c Chart) RenderWithMarks(marks []chartMark) template.HTML {
	from, to := c.From, c.To
	max := 0.0
	for _, l := range c.Lines {
		for _, p := range l.Points {
			if c.From == 0 && (from == 0 || p[0] < from) {
				from = p[0]
			}
			if c.To == 0 && p[0] > to {
				to = p[0]
			}
			max = math.Max(max, p[1])
		}
	}
	max = niceMax(max)
	f := newFrame(chartW, chartH, from, to)
	type lineOut struct {
		Name, Class, Path string
		N                 int
		Last, LMax        float64
	}
	type markOut struct {
		chartMark
		X     float64
		Clock string
		// The label: left of the line near the right edge (it was cut
		// off there), and one line lower than the mark before it.
		LY, DX float64
		Anchor string
	}
	data := struct {
		frame
		ID, Title, Unit string
		Max             float64
		Lines           []lineOut
		Marks           []markOut
	}{frame: f, ID: c.ID, Title: c.Title, Unit: c.Unit, Max: max}
	for i, m := range marks {
		mo := markOut{chartMark: m, X: f.x(m.At), Clock: clock(m.At), LY: f.Y0 + 9 + 11*float64(i%4), DX: 2, Anchor: "start"}
		if mo.X > f.X0+0.75*f.PW {
			mo.DX, mo.Anchor = -2, "end"
		}
		data.Marks = append(data.Marks, mo)
	}
	for i, l := range c.Lines {
		lo := lineOut{Name: l.Name, Class: l.Class, N: len(l.Points)}
		if lo.Class == "" {
			lo.Class = fmt.Sprintf("c%d", i%6)
		}
		var sb strings.Builder
		for j, p := range l.Points {
			if j > 0 {
				sb.WriteByte(' ')
			}
			fmt.Fprintf(&sb, "%.1f,%.1f", f.x(p[0]), f.y(p[1], max))
			lo.LMax = math.Max(lo.LMax, p[1])
		}
		if len(l.Points) > 0 {
			lo.Last = l.Points[len(l.Points)-1][1]
		}
		lo.Path = sb.String()
		data.Lines = append(data.Lines, lo)
	}
	return execSVG("chart", data)
}

// niceMax rounds the top of the value axis up to 1, 2 or 5 × 10^n.
func niceMax(v float64) float64 {
	if v <= 0 {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*e {
			return m * e
		}
	}
	return 10 * e
}

// Sparkline is a small line without axes.
func Sparkline(title string, points [][2]float64) template.HTML {
	data := struct {
		Title, Path string
		Last, Max   float64
		N           int
	}{Title: title, N: len(points)}
	if len(points) > 0 {
		from, to := points[0][0], points[len(points)-1][0]
		for _, p := range points {
			data.Max = math.Max(data.Max, p[1])
		}
		data.Last = points[len(points)-1][1]
		var sb strings.Builder
		for i, p := range points {
			x := 1.0
			if to > from {
				x = 1 + (p[0]-from)/(to-from)*118
			}
			y := 23.0
			if data.Max > 0 {
				y = 23 - p[1]/data.Max*22
			}
			if i > 0 {
				sb.WriteByte(' ')
			}
			fmt.Fprintf(&sb, "%.1f,%.1f", x, y)
		}
		data.Path = sb.String()
		data.Title = fmt.Sprintf("%s: last %.4g, max %.4g", title, data.Last, data.Max)
	}
	return execSVG("spark", data)
}

// Bar is one bar of a bar list.
type Bar struct {
	Label string
	Value float64
}

// Bars draws a horizontal bar per label, largest first.
func Bars(id, title string, bars []Bar) template.HTML {
	sort.SliceStable(bars, func(i, j int) bool { return bars[i].Value > bars[j].Value })
	if len(bars) > 12 {
		bars = bars[:12]
	}
	max := 0.0
	for _, b := range bars {
		max = math.Max(max, b.Value)
	}
	type barOut struct {
		Label                   string
		Value, X, Y, BW, VX, TY float64
	}
	data := struct {
		ID, Title string
		W, H      float64
		Bars      []barOut
	}{ID: id, Title: title, W: 560, H: float64(len(bars))*20 + 4}
	for i, b := range bars {
		bw := 0.0
		if max > 0 {
			bw = b.Value / max * 300
		}
		y := float64(i)*20 + 2
		data.Bars = append(data.Bars, barOut{Label: b.Label, Value: b.Value, X: 200, Y: y, BW: math.Max(bw, 1), VX: 206 + bw, TY: y + 12})
	}
	return execSVG("bars", data)
}

// Takeover is one takeover of a bridge session.
type Takeover struct {
	At, FailureToFull float64
}

// Timeline draws each takeover of a bridge session as a bar as high as
// its failure-to-full, against the session's budget and SLO.
func Timeline(id, title string, from, to float64, tk []Takeover, budget, slo float64) template.HTML {
	f := newFrame(chartW, chartH, from, to)
	top := niceMax(math.Max(budget, slo))
	for _, t := range tk {
		top = math.Max(top, niceMax(t.FailureToFull))
	}
	type mark struct {
		At, Value, X, Y, BH float64
		Label               string
		Over                bool
	}
	data := struct {
		frame
		ID, Title     string
		Budget, SLO   float64
		BudgetY, SLOY float64
		// Top is the value axis' maximum; RX the right end of the
		// lines' labels, drawn inside the plot above their line (left of
		// the plot they were cut off).
		Top, RX float64
		Marks   []mark
	}{frame: f, ID: id, Title: title, Budget: budget, SLO: slo, BudgetY: f.y(budget, top), SLOY: f.y(slo, top), Top: top, RX: f.X1 - 4}
	for _, t := range tk {
		y := f.y(t.FailureToFull, top)
		data.Marks = append(data.Marks, mark{At: t.At, Value: t.FailureToFull, X: f.x(t.At) - 3, Y: y, BH: math.Max(f.Y1-y, 1), Label: clock(t.At),
			Over: budget > 0 && t.FailureToFull > budget})
	}
	return execSVG("timeline", data)
}

// agentCharts are the pictures of an agent's own metrics.
type agentCharts struct {
	Window   string
	Charts   []template.HTML
	Failover []template.HTML
}

// buildAgentCharts groups an agent's series: one chart per class of
// counters (throughput, sent, refused and failed), one of messages in
// flight, and per bridge session a failover timeline.
func buildAgentCharts(w telemetry.Window, now time.Time) agentCharts {
	from, to := float64(now.Add(-time.Duration(w.WindowS)*time.Second).Unix()), float64(now.Unix())
	groups := []struct {
		id, title, unit string
		match           func(telemetry.Series) bool
	}{
		{"chart-throughput", "Received / accepted", "per second", func(s telemetry.Series) bool {
			return strings.HasPrefix(s.Name, "accepted.") || s.Name == "received"
		}},
		{"chart-sent", "Sent / delivered", "per second", func(s telemetry.Series) bool {
			return strings.HasPrefix(s.Name, "sent.") || s.Name == "delivered"
		}},
		{"chart-dropped", "Refused / failed / dead-lettered", "per second", func(s telemetry.Series) bool {
			c := telemetry.Catalog[s.Name].Class
			return c == "refused" || c == "failed"
		}},
		{"chart-inflight", "In flight", "messages", func(s telemetry.Series) bool { return s.Name == "in_flight" }},
	}
	out := agentCharts{Window: (time.Duration(w.WindowS) * time.Second).String()}
	for _, g := range groups {
		c := Chart{ID: g.id, Title: g.title, Unit: g.unit, From: from, To: to}
		for _, s := range w.Series {
			if g.match(s) {
				c.Lines = append(c.Lines, chartLine{Name: s.Name + " " + s.Component, Points: s.Points})
			}
		}
		if len(c.Lines) > 0 {
			out.Charts = append(out.Charts, c.Render())
		}
	}
	type sess struct {
		tk          []Takeover
		budget, slo float64
		seen        bool
	}
	bySess := map[string]*sess{}
	get := func(c string) *sess {
		if bySess[c] == nil {
			bySess[c] = &sess{}
		}
		return bySess[c]
	}
	last := func(p [][2]float64) float64 {
		if len(p) == 0 {
			return 0
		}
		return p[len(p)-1][1]
	}
	for _, s := range w.Series {
		switch s.Name {
		case "takeover.failure_to_full":
			ss := get(s.Component)
			ss.seen = true
			for _, p := range s.Points {
				ss.tk = append(ss.tk, Takeover{At: p[0], FailureToFull: p[1]})
			}
		case "takeover.budget":
			ss := get(s.Component)
			ss.seen, ss.budget = true, last(s.Points)
		case "takeover.slo":
			ss := get(s.Component)
			ss.seen, ss.slo = true, last(s.Points)
		}
	}
	names := make([]string, 0, len(bySess))
	for n := range bySess {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		ss := bySess[n]
		id := "failover-" + strings.TrimPrefix(n, "session/")
		out.Failover = append(out.Failover, Timeline(id, "Failover timeline of "+n, from, to, ss.tk, ss.budget, ss.slo))
	}
	return out
}
