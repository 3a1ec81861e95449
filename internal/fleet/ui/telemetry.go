package ui

import (
	"cmp"
	"context"
	"fmt"
	"html/template"
	"math"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/fleet/telemetry"
)

// The pictures of the agents' own metrics on the overview, the agents
// list, the agent page and the rollout page (charts.go draws them). A page
// whose telemetry cannot be read is still shown, without its pictures.

// sparkWindow is the window of the agents list's sparklines.
const sparkWindow = 30 * time.Minute

// agentSparks are the throughput sparklines of the listed agents.
func (h *handler) agentSparks(ctx context.Context, agents []store.Agent) map[string]template.HTML {
	tr := h.a.Telemetry()
	if tr == nil || len(agents) == 0 {
		return nil
	}
	uids := make([]string, len(agents))
	for i, a := range agents {
		uids[i] = a.InstanceUID
	}
	// The coarse tier: 30 points an agent are enough for a sparkline, and
	// the page reads a sixth of the rows of the fine tier.
	ws, err := tr.AgentsCoarse(ctx, uids, sparkWindow)
	if err != nil {
		h.log.Warn("reading the agents' telemetry for the list", "error", err)
		return nil
	}
	out := make(map[string]template.HTML, len(uids))
	for _, uid := range uids {
		pts := telemetry.Sum(ws[uid].Series, "throughput")
		if len(pts) == 0 {
			continue
		}
		out[uid] = Sparkline("throughput (items or messages per second, 30 min)", pts)
	}
	return out
}

// agentTelemetry are the charts of one agent's page.
func (h *handler) agentTelemetry(ctx context.Context, uid string) *agentCharts {
	tr := h.a.Telemetry()
	if tr == nil {
		return nil
	}
	w, err := tr.Agent(ctx, uid, 15*time.Minute)
	if err != nil {
		h.log.Warn("reading an agent's telemetry", "agent", uid, "error", err)
		return nil
	}
	c := buildAgentCharts(w, time.Now())
	return &c
}

// NotReported is the versions bar of the agents that report no package.
const NotReported = "not reported"

// fleetPictures are the overview's charts: the fleet's throughput and
// drops, and the agents online, offline and unhealthy, over the last
// hour; the versions and configurations in use now.
type fleetPictures struct {
	Charts   []template.HTML
	Versions template.HTML
	Configs  template.HTML
}

func (h *handler) fleetPictures(ctx context.Context) *fleetPictures {
	out := &fleetPictures{}
	if tr := h.a.Telemetry(); tr != nil {
		if w, err := tr.Fleet(ctx, time.Hour); err != nil {
			h.log.Warn("reading the fleet's telemetry", "error", err)
		} else {
			now := time.Now()
			from, to := float64(now.Add(-time.Hour).Unix()), float64(now.Unix())
			flow := Chart{ID: "fleet-throughput", Title: "Fleet throughput, refused and failed", Unit: "per second", From: from, To: to}
			agents := Chart{ID: "fleet-agents", Title: "Agents online, offline and unhealthy", Unit: "agents", From: from, To: to}
			for _, s := range w.Series {
				l := chartLine{Name: s.Name, Class: "s-" + s.Name, Points: s.Points}
				switch s.Name {
				case "throughput", "refused", "failed":
					flow.Lines = append(flow.Lines, l)
				case "agents.online", "agents.offline", "agents.unhealthy":
					l.Class = "s-" + s.Name[len("agents."):]
					agents.Lines = append(agents.Lines, l)
				}
			}
			out.Charts = append(out.Charts, flow.Render(), agents.Render())
		}
	}
	if vs, err := h.a.Store().PackageVersions(ctx); err == nil {
		var bars []Bar
		for _, v := range vs {
			bars = append(bars, Bar{Label: fmt.Sprintf("%s %s", v.Package, cmp.Or(v.Version, "(version not reported)")), Value: float64(v.Agents)})
		}
		// Agents that report no package at all are counted too: a fleet
		// of them is not an empty picture.
		if _, none, err := h.a.Store().AgentsWithoutPackages(ctx); err != nil {
			h.log.Warn("counting agents without package statuses", "error", err)
		} else if none > 0 {
			bars = append(bars, Bar{Label: NotReported, Value: float64(none)})
		}
		out.Versions = Bars("fleet-versions", "Agents per package version", bars)
	} else {
		h.log.Warn("reading package versions", "error", err)
	}
	if cs, err := h.a.Store().ConfigsInUse(ctx); err == nil {
		var bars []Bar
		for _, c := range cs {
			bars = append(bars, Bar{Label: c.Label, Value: float64(c.Agents)})
		}
		out.Configs = Bars("fleet-configs", "Agents per configuration in use", bars)
	} else {
		h.log.Warn("reading configurations in use", "error", err)
	}
	return out
}

// rolloutPicture is the throughput of a rollout's agents around its
// waves: the sum over its (listed) agents, with each wave's start
// marked, and per wave the mean throughput of its agents in the
// rolloutAround before the wave started and after it completed.
type rolloutPicture struct {
	Chart template.HTML
	Waves []waveThroughput
}

type waveThroughput struct {
	Wave          int
	Before, After float64
	// HasAfter is false while the wave has not completed (or its after
	// window has not passed).
	HasBefore, HasAfter bool
}

const rolloutAround = 5 * time.Minute

func (h *handler) rolloutPicture(ctx context.Context, d rollout.Detail) *rolloutPicture {
	tr := h.a.Telemetry()
	if tr == nil || len(d.Agents) == 0 {
		return nil
	}
	var first time.Time
	for _, w := range d.WaveProgress {
		if w.StartedAt != nil && (first.IsZero() || w.StartedAt.Before(first)) {
			first = *w.StartedAt
		}
	}
	if first.IsZero() {
		return nil
	}
	now := time.Now()
	window := now.Sub(first) + rolloutAround
	window = min(max(window, 10*time.Minute), tr.MaxWindow())
	uids := make([]string, len(d.Agents))
	waveOf := map[string]int{}
	for i, a := range d.Agents {
		uids[i] = a.InstanceUID
		waveOf[a.InstanceUID] = a.Wave
	}
	ws, err := tr.Agents(ctx, uids, window)
	if err != nil {
		h.log.Warn("reading a rollout's telemetry", "error", err)
		return nil
	}
	var all []telemetry.Series
	perWave := map[int][]telemetry.Series{}
	for uid, w := range ws {
		all = append(all, w.Series...)
		perWave[waveOf[uid]] = append(perWave[waveOf[uid]], w.Series...)
	}
	c := Chart{ID: "rollout-throughput", Title: "Throughput of the rollout's agents (waves marked)", Unit: "per second",
		From: float64(now.Add(-window).Unix()), To: float64(now.Unix()),
		Lines: []chartLine{{Name: "throughput", Class: "s-throughput", Points: telemetry.Sum(all, "throughput")}}}
	p := &rolloutPicture{}
	var marks []chartMark
	for _, w := range d.WaveProgress {
		if w.StartedAt == nil {
			continue
		}
		pts := telemetry.Sum(perWave[w.Wave], "throughput")
		wt := waveThroughput{Wave: w.Wave}
		start := float64(w.StartedAt.Unix())
		wt.Before, wt.HasBefore = mean(pts, start-rolloutAround.Seconds(), start)
		if w.CompletedAt != nil {
			end := float64(w.CompletedAt.Unix())
			wt.After, wt.HasAfter = mean(pts, end, end+rolloutAround.Seconds())
		}
		p.Waves = append(p.Waves, wt)
		marks = append(marks, chartMark{At: start, Label: fmt.Sprintf("wave %d", w.Wave), Before: wt.Before, After: wt.After})
	}
	p.Chart = c.RenderWithMarks(marks)
	return p
}

// mean is the mean value of points in [from, to).
func mean(pts [][2]float64, from, to float64) (float64, bool) {
	s, n := 0.0, 0
	for _, p := range pts {
		if p[0] >= from && p[0] < to {
			s += p[1]
			n++
		}
	}
	if n == 0 {
		return 0, false
	}
	return math.Round(s/float64(n)*100) / 100, true
}
