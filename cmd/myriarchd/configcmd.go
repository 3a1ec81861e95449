package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/myriarch/myriarch/internal/fleet/api"
	"github.com/myriarch/myriarch/internal/fleet/apiclient"
	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

func init() {
	name := []string{"NAME"}
	apiCommands = append(apiCommands,
		apiCmd{group: "config", name: "list", summary: "configurations (GET /api/v1/configs)",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				l, err := c.Configs(ctx)
				return l, func(w io.Writer) { printConfigs(w, l.Configs) }, err
			}},
		apiCmd{group: "config", name: "show", args: name, summary: "a configuration and its revisions (GET /api/v1/configs/{name})",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				d, err := c.Config(ctx, x.arg(0))
				return d, func(w io.Writer) { printConfig(w, d) }, err
			}},
		apiCmd{group: "config", name: "put", args: name, summary: "create or update a configuration (PUT /api/v1/configs/{name})",
			flags: map[string]string{"type": "configuration type: " + strings.Join(configs.Types(), ", "),
				"selector": "label selector over agent attributes: key=value,key2=value2",
				"priority": "precedence when several configurations match an agent (highest wins, then the smallest name)"},
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				req := api.PutConfigRequest{Type: x.str("type"), Selector: x.str("selector"), Priority: x.integer("priority", 0)}
				if err := x.refused(); err != nil {
					return nil, nil, err
				}
				d, err := c.PutConfig(ctx, x.arg(0), req)
				return d, func(w io.Writer) { fmt.Fprintf(w, "stored configuration %s\n", d.Config.Name) }, err
			}},
		apiCmd{group: "config", name: "revise", args: name, summary: "validate --file and store it as the next revision; sends nothing to agents (POST /api/v1/configs/{name}/revisions)",
			flags: map[string]string{"file": "file with the content of the revision; - reads standard input"},
			run: withFile(func(ctx context.Context, c *apiclient.Client, x *apiCall, content string) (any, func(io.Writer), error) {
				r, err := c.AddRevision(ctx, x.arg(0), content)
				return r, func(w io.Writer) {
					if !r.Created {
						fmt.Fprintf(w, "unchanged: equal to revision %d of %s\n", r.Revision.Revision, x.arg(0))
						return
					}
					fmt.Fprintf(w, "stored revision %d of %s (hash %s)\n", r.Revision.Revision, x.arg(0), r.Revision.Hash)
				}, err
			})},
		apiCmd{group: "config", name: "cat", args: []string{"NAME", "REVISION"}, summary: "the content of a revision (GET /api/v1/configs/{name}/revisions/{rev})",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				n := x.revision(1)
				if err := x.refused(); err != nil {
					return nil, nil, err
				}
				r, err := c.Revision(ctx, x.arg(0), n)
				return r, func(w io.Writer) { io.WriteString(w, r.Content) }, err
			}},
		apiCmd{group: "config", name: "diff", args: []string{"NAME", "FROM", "TO"}, summary: "unified diff between two revisions; 0 is the empty document (GET /api/v1/configs/{name}/diff)",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				from, to := x.revisionOrEmpty(1), x.revisionOrEmpty(2)
				if err := x.refused(); err != nil {
					return nil, nil, err
				}
				d, err := c.Diff(ctx, x.arg(0), from, to)
				return d, func(w io.Writer) { io.WriteString(w, d.Diff) }, err
			}},
		apiCmd{group: "config", name: "preview", args: []string{"NAME", "REVISION"}, summary: "what each agent of the configuration runs now against the revision, grouped by effective config, with the diff (GET /api/v1/configs/{name}/revisions/{rev}/preview)",
			flags: map[string]string{"selector": "narrows the agents: key=value,... over their attributes"},
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				n := x.revision(1)
				if _, err := store.ParseSelector(x.str("selector")); err != nil {
					x.bad = append(x.bad, "--selector: "+err.Error())
				}
				if err := x.refused(); err != nil {
					return nil, nil, err
				}
				pv, err := c.Preview(ctx, x.arg(0), n, x.str("selector"))
				return pv, func(w io.Writer) { printPreview(w, pv) }, err
			}},
	)
	registerGroup("config", "configurations: config list | show NAME | put NAME --type T | revise NAME --file F | diff NAME A B | cat NAME REV | preview NAME REV",
		"A revision is validated for its type before it is stored; storing it sends\nnothing to agents: a rollout does (myriarchd rollout create NAME).", nil)

	id := []string{"ID"}
	apiCommands = append(apiCommands,
		rolloutRequestCmd("create", "roll configuration NAME out in waves (POST /api/v1/rollouts)",
			func(ctx context.Context, c *apiclient.Client, req rollout.Request) (any, func(io.Writer), error) {
				ro, err := c.CreateRollout(ctx, req)
				return ro, func(w io.Writer) {
					fmt.Fprintf(w, "rollout %d created: %s revision %d → %d; the leader plans it within jobs.rolloutInterval\n", ro.ID, ro.Config, ro.FromRevision, ro.ToRevision)
				}, err
			}),
		rolloutRequestCmd("plan", "dry run of rollout create: the waves with their agents, the agents skipped and why; nothing is stored (POST /api/v1/rollouts/plan)",
			func(ctx context.Context, c *apiclient.Client, req rollout.Request) (any, func(io.Writer), error) {
				pl, err := c.PlanRollout(ctx, req)
				return pl, func(w io.Writer) { printPlan(w, pl) }, err
			}),
		apiCmd{group: "rollout", name: "list", args: []string{"[NAME]"}, summary: "rollouts, newest first; of configuration NAME only if given (GET /api/v1/rollouts)",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				l, err := c.Rollouts(ctx, x.arg(0))
				return l, func(w io.Writer) { printRollouts(w, l.Rollouts) }, err
			}},
		apiCmd{group: "rollout", name: "show", args: id, summary: "a rollout's waves and its failed or skipped agents (GET /api/v1/rollouts/{id})",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				n := x.id(0, "rollout list")
				if err := x.refused(); err != nil {
					return nil, nil, err
				}
				d, err := c.Rollout(ctx, n)
				return d, func(w io.Writer) { printRollout(w, d) }, err
			}},
	)
	for _, cmd := range []string{rollout.CmdPause, rollout.CmdResume, rollout.CmdAbort, rollout.CmdRollback} {
		apiCommands = append(apiCommands, apiCmd{group: "rollout", name: cmd, args: id, summary: cmd + " a rollout; the leader carries it out within jobs.rolloutInterval (POST /api/v1/rollouts/{id}/" + cmd + ")",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				n := x.id(0, "rollout list")
				if err := x.refused(); err != nil {
					return nil, nil, err
				}
				ro, err := c.RolloutCommand(ctx, n, cmd)
				return ro, func(w io.Writer) {
					fmt.Fprintf(w, "rollout %d: %s requested (state %s); the leader carries it out within jobs.rolloutInterval\n", ro.ID, cmd, ro.State)
				}, err
			}})
	}
	registerGroup("rollout", "configuration rollouts: rollout create NAME | plan NAME | list [NAME] | show ID | pause|resume|abort|rollback ID",
		"The leader carries out a rollout and the commands; they take effect within\njobs.rolloutInterval.", nil)
}

// specFlags are the flags of a rollout spec (configuration and package
// rollouts): flag → usage. A field added to rollout.Spec gets its flag
// here and its line in apiCall.spec.
var specFlags = map[string]string{
	"waves":              "cumulative wave targets: a number of agents or a percentage; the last must be 100% (default " + strings.Join(rollout.DefaultWaves, ",") + ")",
	"max-in-progress":    fmt.Sprintf("agents sent the new version and not reported yet, at most (default %d)", rollout.DefaultMaxInProgress),
	"bake":               "time each agent must stay healthy after APPLIED before the next wave (default " + rollout.DefaultBake.String() + ")",
	"apply-timeout":      "an agent without APPLIED/FAILED report after this fails (default " + rollout.DefaultApplyTimeout.String() + ")",
	"failure-policy":     "pause or rollback (default " + rollout.PolicyPause + ")",
	"max-failed":         "more failed agents than this trip the failure policy (default 0)",
	"max-failed-percent": "more failed agents than this share (percent) trip the failure policy; 0: not used",
	"selector":           "narrows the configuration's selector: key=value,...",
	"order":              "wave order: " + strings.Join(rollout.Orders, " or ") + " (bridges: every standby before the owner of its bridge; default " + rollout.OrderUID + ")",
}

func withSpecFlags(m map[string]string) map[string]string {
	for k, v := range specFlags {
		m[k] = v
	}
	return m
}

// rolloutRequestCmd is a rollout command (create, plan) that sends the
// rollout of configuration NAME that --to and the spec flags describe.
func rolloutRequestCmd(name, summary string, send func(context.Context, *apiclient.Client, rollout.Request) (any, func(io.Writer), error)) apiCmd {
	return apiCmd{group: "rollout", name: name, args: []string{"NAME"}, summary: summary,
		flags: withSpecFlags(map[string]string{"to": "revision to roll out (default: the newest)"}),
		run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
			req := rollout.Request{Config: x.arg(0), ToRevision: x.integer("to", 0), Spec: x.spec()}
			if err := x.refused(); err != nil {
				return nil, nil, err
			}
			return send(ctx, c, req)
		}}
}

// spec is the rollout spec of the flags; absent flags take the defaults.
func (x *apiCall) spec() rollout.Spec {
	sel, err := store.ParseSelector(x.str("selector"))
	if err != nil {
		x.bad = append(x.bad, "--selector: "+err.Error())
	}
	waves := rollout.DefaultWaves
	if v := x.str("waves"); v != "" {
		waves = strings.Split(v, ",")
	}
	policy := x.str("failure-policy")
	if policy == "" {
		policy = rollout.PolicyPause
	}
	return rollout.Spec{Waves: waves, MaxInProgress: x.integer("max-in-progress", rollout.DefaultMaxInProgress),
		BakeS: rollout.Secs(x.duration("bake", rollout.DefaultBake).Seconds()), ApplyTimeoutS: x.duration("apply-timeout", rollout.DefaultApplyTimeout).Seconds(),
		FailurePolicy: policy, MaxFailed: x.integer("max-failed", 0), MaxFailedPercent: x.number("max-failed-percent", 0), Selector: sel,
		Order: x.str("order")}
}

func printConfigs(w io.Writer, cs []store.ConfigDef) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTYPE\tSELECTOR\tPRIORITY\tCURRENT\tLATEST\tSOURCE")
	for _, d := range cs {
		src := d.Source
		if d.DeletedAt != nil {
			src += " (deleted)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\n", d.Name, d.Type, configs.FormatSelector(d.Selector), d.Priority, d.CurrentRevision, d.LatestRevision, src)
	}
	_ = tw.Flush()
}

func printConfig(w io.Writer, d api.ConfigDetail) {
	fmt.Fprintf(w, "%s (%s) selector %q priority %d, current revision %d\n", d.Config.Name, d.Config.Type, configs.FormatSelector(d.Config.Selector), d.Config.Priority, d.Config.CurrentRevision)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REVISION\tCREATED\tAUTHOR\tCOMMIT\tHASH")
	for _, r := range d.Revisions {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", r.Revision, ts(&r.CreatedAt), r.Author, r.SourceCommit, short(r.Hash))
	}
	_ = tw.Flush()
}

func printRollouts(w io.Writer, rs []rollout.Summary) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCONFIG\tREVISIONS\tSTATE\tWAVE\tAPPLIED\tFAILED\tPENDING\tIN PROGRESS\tSKIPPED\tREASON")
	for _, ro := range rs {
		fmt.Fprintf(tw, "%d\t%s\t%d → %d\t%s\t%d/%d\t%s\t%s\n", ro.ID, ro.Config, ro.FromRevision, ro.ToRevision, ro.State, ro.Wave, ro.Waves,
			agentCounts(ro.Counts), ro.Reason)
	}
	_ = tw.Flush()
}

func printRollout(w io.Writer, d rollout.Detail) {
	fmt.Fprintf(w, "rollout %d: %s revision %d → %d, %s, wave %d of %d %s\n", d.ID, d.Config, d.FromRevision, d.ToRevision, d.State, d.Wave, d.Waves, d.Reason)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WAVE\tSIZE\tAPPLIED\tFAILED\tPENDING\tIN PROGRESS\tSKIPPED\tGATE PASSED")
	for _, wp := range d.WaveProgress {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\n", wp.Wave, wp.Size, agentCounts(wp.Counts), ts(wp.GatePassedAt))
	}
	_ = tw.Flush()
	for _, a := range d.Agents {
		if a.State == rollout.AgentFailed || a.State == rollout.AgentSkipped {
			fmt.Fprintf(w, "  %s %s (wave %d): %s\n", a.InstanceUID, a.State, a.Wave, a.Detail)
		}
	}
}

// agentCounts is the tab-separated columns APPLIED to SKIPPED of a rollout
// or a wave.
func agentCounts(n map[string]int) string {
	return fmt.Sprintf("%d\t%d\t%d\t%d\t%d", n[rollout.AgentApplied], n[rollout.AgentFailed], n[rollout.AgentPending], n[rollout.AgentInProgress], n[rollout.AgentSkipped])
}

func printPlan(w io.Writer, p rollout.Plan) {
	fmt.Fprintf(w, "plan: %s revision %d, order %s, %d wave(s)\n", p.Config, p.Revision, p.Order, len(p.Waves))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WAVE\tAGENT\tBRIDGE\tROLES")
	for _, wv := range p.Waves {
		for _, a := range wv.Agents {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", wv.Index, a.UID, dash(a.BridgeID), dash(strings.Join(a.Roles, ",")))
		}
	}
	_ = tw.Flush()
	for _, sk := range p.Skipped {
		fmt.Fprintf(w, "skipped %s: %s\n", sk.UID, sk.Reason)
	}
}

func printPreview(w io.Writer, p configs.Preview) {
	fmt.Fprintf(w, "preview: %s revision %d (hash %s), %d group(s) of agents by what they run now\n", p.Config, p.Revision, p.Hash, len(p.Groups))
	for _, g := range p.Groups {
		state := "would change"
		if g.UpToDate {
			state = "up to date"
		}
		fmt.Fprintf(w, "\n== %d agent(s) running %s: %s\n   %s\n", len(g.Agents), dash(g.EffectiveHash), state, strings.Join(g.Agents, " "))
		if g.DiffOmitted {
			io.WriteString(w, "   (diff omitted: only the largest groups carry one)\n")
		} else if !g.UpToDate {
			io.WriteString(w, g.Diff)
		}
	}
}

// dash stands in for an empty table cell.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
