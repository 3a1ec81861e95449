package lab

import (
	"fmt"
	"slices"
	"strings"
)

// ScaleTable is the Markdown table of scale runs (one row per number of
// sessions and scenario), as docs/bridge.md shows it.
func ScaleTable(reps []*ScaleReport) string {
	var b strings.Builder
	b.WriteString("| store | sessions | scenario | within budget | all full | max per session | one session | herd ratio | budget | memory per session | owner CPU, no messages | lease calls/s, steady | broker connects in the herd | lease calls/s in the herd | peak memory | lost | stale | load average |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, rep := range reps {
		for _, r := range rep.Scenarios {
			fmt.Fprintf(&b, "| %s | %d | %s | %d/%d | %.2f s | %.2f s | %.2f s | %.2f | %.1f s | %.0f kB | %.2f %% | %.0f | %d | %.0f | %.1f MB | %d | %d | %s |\n",
				rep.Store, r.Sessions, r.Scenario, r.SessionsWithinBudget, r.Sessions, r.AllFullS, r.MaxFailureToFullS, r.SingleSessionFullS, r.HerdRatio,
				r.BudgetS, r.RSSPerSessionKB, r.RenewCPUPct, r.SteadyStoreOpsPerS, r.BrokerConnectAttempts, r.HerdStoreOpsPerS, float64(r.PeakRSSKB)/1024,
				r.Lost, r.StaleDeliveries, rep.LoadAvg)
		}
	}
	return b.String()
}

// ScaleSVG plots scale runs against the number of sessions: the herd's
// time to full service (owner_sigkill) beside the one-session reference,
// memory per session, and the owner's CPU with no messages flowing.
func ScaleSVG(reps []*ScaleReport) string {
	type point struct{ n, herd, single, mem, cpu float64 }
	var pts []point
	for _, rep := range reps {
		for _, r := range rep.Scenarios {
			if r.Scenario == OwnerSIGKILL {
				pts = append(pts, point{float64(r.Sessions), r.AllFullS, r.SingleSessionFullS, r.RSSPerSessionKB, r.RenewCPUPct})
			}
		}
	}
	slices.SortFunc(pts, func(a, b point) int {
		switch {
		case a.n < b.n:
			return -1
		case a.n > b.n:
			return 1
		}
		return 0
	})
	const w, h, pw, ph, left, top = 1000, 300, 260, 200, 60, 50
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	panels := []struct {
		title string
		ys    []func(point) float64
		names []string
	}{
		{"owner_sigkill: fault → all sessions full (s)", []func(point) float64{func(p point) float64 { return p.herd }, func(p point) float64 { return p.single }}, []string{"all sessions", "one session"}},
		{"memory per session (kB)", []func(point) float64{func(p point) float64 { return p.mem }}, []string{"rss"}},
		{"owner CPU, no messages (% of a core)", []func(point) float64{func(p point) float64 { return p.cpu }}, []string{"cpu"}},
	}
	colors := []string{"#1f77b4", "#ff7f0e"}
	maxN := 1.0
	for _, p := range pts {
		maxN = max(maxN, p.n)
	}
	for i, pn := range panels {
		x0 := float64(left + i*(pw+60))
		maxY := 0.0
		for _, p := range pts {
			for _, y := range pn.ys {
				maxY = max(maxY, y(p))
			}
		}
		if maxY == 0 {
			maxY = 1
		}
		maxY *= 1.1
		fmt.Fprintf(&b, `<text x="%.0f" y="%d">%s</text>`+"\n", x0, top-20, pn.title)
		fmt.Fprintf(&b, `<rect x="%.0f" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", x0, top, pw, ph)
		fmt.Fprintf(&b, `<text x="%.0f" y="%d" text-anchor="end">%.3g</text><text x="%.0f" y="%d" text-anchor="end">0</text>`+"\n", x0-4, top+10, maxY, x0-4, top+ph)
		fmt.Fprintf(&b, `<text x="%.0f" y="%d">0</text><text x="%.0f" y="%d" text-anchor="end">%.0f sessions</text>`+"\n", x0, top+ph+16, x0+pw, top+ph+16, maxN)
		for k, y := range pn.ys {
			var line []string
			for _, p := range pts {
				px, py := x0+p.n/maxN*pw, float64(top+ph)-y(p)/maxY*ph
				line = append(line, fmt.Sprintf("%.1f,%.1f", px, py))
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", px, py, colors[k])
			}
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s"/>`+"\n", strings.Join(line, " "), colors[k])
			if len(pn.names) > 1 {
				fmt.Fprintf(&b, `<text x="%.0f" y="%d" fill="%s">%s</text>`+"\n", x0+8, top+16+14*k, colors[k], pn.names[k])
			}
		}
	}
	loads := []string{}
	for _, rep := range reps {
		loads = append(loads, rep.LoadAvg)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#555">store %s; load average at the end of each run: %s</text>`+"\n", left, h-10, storesOf(reps), strings.Join(loads, "; "))
	b.WriteString("</svg>\n")
	return b.String()
}

func storesOf(reps []*ScaleReport) string {
	var s []string
	for _, r := range reps {
		if !slices.Contains(s, r.Store) {
			s = append(s, r.Store)
		}
	}
	return strings.Join(s, ", ")
}
