package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/apiclient"
	"github.com/myriarch/myriarch/internal/fleet/telemetry"
	"github.com/myriarch/myriarch/internal/godur"
)

// The telemetry commands: an agent's own metrics and the fleet's sums
// (docs/myriarchd.md, Telemetry), through the REST API.

func init() {
	window := func(def string) map[string]string {
		return map[string]string{"window": "the window, a duration such as 5m or 24h, at most telemetry.coarseRetention (default " + def + ")"}
	}
	apiCommands = append(apiCommands,
		apiCmd{group: "agent", name: "telemetry", args: []string{"UID"}, flags: window("5m"),
			summary: "the agent's own metrics: per series and component, the rate or value over the window (GET /api/v1/agents/{uid}/telemetry)",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				win := x.duration("window", 0)
				if err := x.refused(); err != nil {
					return nil, nil, err
				}
				t, err := c.AgentTelemetry(ctx, x.arg(0), win)
				return t, func(w io.Writer) {
					fmt.Fprintf(w, "agent %s: ", t.InstanceUID)
					printTelemetry(w, t.Window, "no own metrics in this window (does the agent report them? see `myriarchd agent show`)")
				}, err
			}},
		apiCmd{group: "telemetry", flags: window("1h"),
			summary: "the fleet's sums of the agents' own metrics per coarse bucket: throughput, refused, failed, agents (GET /api/v1/telemetry)",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				win := x.duration("window", 0)
				if err := x.refused(); err != nil {
					return nil, nil, err
				}
				t, err := c.FleetTelemetry(ctx, win)
				return t, func(w io.Writer) {
					fmt.Fprint(w, "fleet: ")
					printTelemetry(w, t.Window, "no fleet sums in this window yet (the leader's telemetry job writes one per coarse bucket)")
				}, err
			}},
	)
	registerGroup("telemetry", "the fleet's sums of the agents' own metrics (GET /api/v1/telemetry); one agent's: agent telemetry UID", "", nil)
}

// printTelemetry prints a window as one line per series: its last point,
// mean and maximum, and the number of points.
func printTelemetry(w io.Writer, tw telemetry.Window, empty string) {
	fmt.Fprintf(w, "window %s, resolution %s\n", godur.Format(time.Duration(tw.WindowS*float64(time.Second))),
		godur.Format(time.Duration(tw.ResolutionS*float64(time.Second))))
	points := 0
	for _, s := range tw.Series {
		points += len(s.Points)
	}
	if points == 0 {
		fmt.Fprintln(w, empty)
		return
	}
	tab := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tab, "SERIES\tCOMPONENT\tUNIT\tLAST\tLAST AT\tMEAN\tMAX\tPOINTS")
	for _, s := range tw.Series {
		if len(s.Points) == 0 {
			fmt.Fprintf(tab, "%s\t%s\t%s\t-\t-\t-\t-\t0\n", s.Name, s.Component, s.Unit)
			continue
		}
		sum, top := 0.0, s.Points[0][1]
		for _, p := range s.Points {
			sum += p[1]
			top = max(top, p[1])
		}
		last := s.Points[len(s.Points)-1]
		fmt.Fprintf(tab, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", s.Name, s.Component, s.Unit, num(last[1]),
			time.Unix(int64(last[0]), 0).UTC().Format(time.RFC3339), num(sum/float64(len(s.Points))), num(top), len(s.Points))
	}
	_ = tab.Flush()
}

// num prints a value with at most two decimals.
func num(v float64) string { return fmt.Sprintf("%.2f", v) }
