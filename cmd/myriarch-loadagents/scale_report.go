package main

// scale-report turns the JSON lines of `scale --json` into the growth table
// of docs/myriarchd.md (Markdown) and a plot (SVG).

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"

	"github.com/myriarch/myriarch/internal/cli"
)

func init() {
	commands.Register(cli.Command{Name: "scale-report", Summary: "Markdown growth table and SVG plot from the JSON lines of scale --json",
		Run: func(args []string, stdout, stderr io.Writer) int {
			return exitOf(stderr, "scale-report", runScaleReport(args, os.Stdin, stdout, stderr))
		}})
}

func runScaleReport(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("scale-report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	in := fs.String("in", "-", "JSON lines of scale --json (several runs may be concatenated; - is stdin)")
	svg := fs.String("svg", "", "write the plot to this SVG file")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	var src io.Reader = stdin
	if *in != "-" {
		f, err := os.Open(*in)
		if err != nil {
			return err
		}
		defer f.Close()
		src = f
	}
	rs, err := readScaleResults(src)
	if err != nil {
		return err
	}
	if len(rs) == 0 {
		return fmt.Errorf("%s: no results", *in)
	}
	fmt.Fprint(stdout, scaleTable(rs))
	if *svg != "" {
		return os.WriteFile(*svg, []byte(scaleSVG(rs)), 0o644)
	}
	return nil
}

func readScaleResults(r io.Reader) ([]scaleResult, error) {
	var rs []scaleResult
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		t := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(t, "{") {
			continue
		}
		var x scaleResult
		if err := json.Unmarshal([]byte(t), &x); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		rs = append(rs, x)
	}
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].Agents < rs[j].Agents })
	return rs, sc.Err()
}

// scaleTable is the growth table: one column per fleet size.
func scaleTable(rs []scaleResult) string {
	var b strings.Builder
	b.WriteString("| |")
	for _, r := range rs {
		fmt.Fprintf(&b, " %s agents, %d replicas |", thousands(r.Agents), r.Replicas)
	}
	b.WriteString("\n|---|")
	for range rs {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	row := func(name string, f func(r scaleResult) string) {
		b.WriteString("| " + name + " |")
		for _, r := range rs {
			b.WriteString(" " + f(r) + " |")
		}
		b.WriteString("\n")
	}
	// ops marks the figures of a run without the operations (--ops=false).
	ops := func(f func(r scaleResult) string) func(r scaleResult) string {
		return func(r scaleResult) string {
			if r.WaveAgents == 0 && r.KilledReplicaAgents == 0 && r.Revoked == 0 {
				return "not run"
			}
			return f(r)
		}
	}
	row("Online (plain-HTTP among them)", func(r scaleResult) string {
		return fmt.Sprintf("%s (%s)", thousands(int(r.Online)), thousands(r.HTTPAgents))
	})
	row("Memory per agent, myriarchd / bare opamp-go (KB RSS)", func(r scaleResult) string {
		if r.BareAgents == 0 {
			return fmt.Sprintf("%.1f / not run", r.KBPerAgent)
		}
		return fmt.Sprintf("%.1f / %.1f (bare at %s)", r.KBPerAgent, r.BareKBPerAgent, thousands(r.BareAgents))
	})
	row("Replica CPU, steady (% of a core; per 1k agents; bare per 1k)", func(r scaleResult) string {
		return fmt.Sprintf("%.1f; %.2f; %.2f", r.ReplicaCPUPct, r.ReplicaCPUPctPer1k, r.BareCPUPctPer1k)
	})
	row("PostgreSQL CPU, steady (% of a core)", func(r scaleResult) string { return fmt.Sprintf("%.1f", r.PGCPUPct) })
	row("PostgreSQL connections; row writes/s; commits/s", func(r scaleResult) string {
		return fmt.Sprintf("%d; %.0f; %.0f", r.PGConnections, r.WritesPerS, r.CommitsPerS)
	})
	row("Event-bus notifications/s, steady; during the rollout", func(r scaleResult) string {
		return fmt.Sprintf("%.1f; %.0f", r.NotificationsPerS, r.RolloutNotifPerS)
	})
	row("All agents connected and online (s)", func(r scaleResult) string { return fmt.Sprintf("%.1f", r.ConnectAllS) })
	row("Rollout: plan (s); largest wave applied (s); gate latency (s)", ops(func(r scaleResult) string {
		return fmt.Sprintf("%.2f; %.1f (%s agents); %.1f", r.RolloutPlanS, r.WaveApplyS, thousands(r.WaveAgents), r.GateLatencyS)
	}))
	row("Follower killed: its agents all online elsewhere (s); lost; double-counted", ops(func(r scaleResult) string {
		return fmt.Sprintf("%.1f (%s agents); %d; %d", r.ReplicaKillAllOnlineS, thousands(int(r.KilledReplicaAgents)), r.Lost, r.DoubleCounted)
	}))
	row("Leader killed mid-rollout: new leader (s); rollout done (s); revision once / twice / missing", ops(func(r scaleResult) string {
		return fmt.Sprintf("%.1f; %.1f; %s / %d / %d", r.LeaderFailoverS, r.LeaderKillRolloutS, thousands(r.RevisionOnce), r.RevisionDuplicates, r.RevisionMissing)
	}))
	row("Revocation storm: revoked; WebSocket ones offline (s); all offline (s)", ops(func(r scaleResult) string {
		return fmt.Sprintf("%s; %.1f; %.1f", thousands(r.Revoked), r.RevokeAllOfflineS, r.RevokeHTTPOfflineS)
	}))
	row("Load average while measured (1, 5, 15 min)", func(r scaleResult) string {
		return strings.Trim(strings.Join(strings.Fields(fmt.Sprint(r.LoadAvg)), ", "), "[]")
	})
	return b.String()
}

func thousands(n int) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return s
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// scaleSVG plots memory per agent (myriarchd and bare opamp-go) and CPU
// (replica per 1k agents, PostgreSQL) against the fleet size, log scale.
func scaleSVG(rs []scaleResult) string {
	const w, h, pad = 760, 300, 50
	pw := (w - 3*pad) / 2
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", w, h, w, h)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	xs := make([]float64, len(rs))
	for i, r := range rs {
		xs[i] = float64(r.Agents)
	}
	panel := func(x0 int, title, unit string, series []svgSeries) {
		ymax := 0.0
		for _, s := range series {
			for _, v := range s.ys {
				ymax = max(ymax, v)
			}
		}
		ymax = niceMax(ymax)
		lo, hi := math.Log10(xs[0]), math.Log10(xs[len(xs)-1])
		if hi == lo {
			lo, hi = lo-0.5, hi+0.5
		}
		px := func(x float64) float64 { return float64(x0) + (math.Log10(x)-lo)/(hi-lo)*float64(pw) }
		py := func(y float64) float64 { return float64(h-pad) - y/ymax*float64(h-2*pad) }
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="13">%s</text>`+"\n", x0, pad-20, title)
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", x0, h-pad, x0+pw, h-pad)
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", x0, pad, x0, h-pad)
		for i := 0; i <= 4; i++ {
			y := ymax * float64(i) / 4
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n", x0-4, py(y)+4, round(y, 2))
			fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", x0, py(y), x0+pw, py(y))
		}
		for _, x := range xs {
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", px(x), h-pad+15, thousands(int(x)))
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">agents (log scale); %s</text>`+"\n", x0+pw/2, h-pad+32, unit)
		for k, s := range series {
			var pts []string
			for i, v := range s.ys {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(xs[i]), py(v)))
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", px(xs[i]), py(v), s.color)
			}
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), s.color)
			fmt.Fprintf(&b, `<text x="%d" y="%d" fill="%s">%s</text>`+"\n", x0+10, pad+14*(k+1), s.color, s.name)
		}
	}
	col := func(f func(r scaleResult) float64) []float64 {
		out := make([]float64, len(rs))
		for i, r := range rs {
			out[i] = f(r)
		}
		return out
	}
	panel(pad, "Memory per agent", "KB RSS per agent", []svgSeries{
		{"myriarchd (mean of the replicas)", "#1f77b4", col(func(r scaleResult) float64 { return r.KBPerAgent })},
		{"bare opamp-go server", "#ff7f0e", col(func(r scaleResult) float64 { return r.BareKBPerAgent })}})
	panel(2*pad+pw, "CPU at steady state", "% of one core", []svgSeries{
		{"PostgreSQL", "#2ca02c", col(func(r scaleResult) float64 { return r.PGCPUPct })},
		{"one replica (mean)", "#d62728", col(func(r scaleResult) float64 { return r.ReplicaCPUPct })}})
	b.WriteString("</svg>\n")
	return b.String()
}

type svgSeries struct {
	name, color string
	ys          []float64
}

// niceMax rounds v up to 1, 2 or 5 times a power of ten.
func niceMax(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow10(int(math.Floor(math.Log10(v))))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}
