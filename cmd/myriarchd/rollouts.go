package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/fleet/config"
	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

func init() {
	commands.Register(cli.Command{
		Name:    "config",
		Summary: "manage configurations: config list | show NAME | put NAME --type T | revise NAME --file F | diff NAME A B | cat NAME REV",
		Run:     runConfig,
	})
	commands.Register(cli.Command{
		Name:    "rollout",
		Summary: "manage rollouts: rollout create --config NAME | list | show ID | pause|resume|abort|rollback ID",
		Run:     runRollout,
	})
}

const configUsage = `Usage:
  myriarchd config list [--json]
  myriarchd config show NAME [--json]
  myriarchd config put NAME --type yaml|myriarch-bridge [--selector k=v,...] [--priority N]
  myriarchd config revise NAME --file FILE|-        (stores FILE as the next revision)
  myriarchd config diff NAME FROM TO
  myriarchd config cat NAME REVISION
Common flag: --config FILE (only database.url is used; env MYRIARCH_CONFIG).
A revision is validated for its type before it is stored; storing it sends
nothing to agents: a rollout does (myriarchd rollout create).`

const rolloutUsage = `Usage:
  myriarchd rollout create --config NAME [--to REV] [--waves 1,10%,50%,100%] [--max-in-progress N]
        [--bake 1m] [--apply-timeout 5m] [--failure-policy pause|rollback] [--max-failed K]
        [--max-failed-percent X] [--selector k=v,...]
  myriarchd rollout list [--for NAME] [--json]
  myriarchd rollout show ID [--json]
  myriarchd rollout pause|resume|abort|rollback ID
Common flag: --config-file FILE (only database.url is used; env MYRIARCH_CONFIG).
The leader carries out a rollout and the commands; they take effect within
jobs.rolloutInterval.`

// cmdFlags parses flags that may come before and after positional args.
func cmdFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
}

// openDB loads the configuration file (database.url only) and opens the store.
func openDB(ctx context.Context, prog, file string, stderr io.Writer) (*store.Store, int) {
	cfg, err := config.Load(config.Source{File: file, Optional: []string{"server.enrollmentSecret"}})
	if err != nil {
		fmt.Fprintln(stderr, "myriarchd: invalid configuration:")
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintln(stderr, "  "+line)
		}
		return nil, cli.ExitUsage
	}
	st, err := store.Open(ctx, cfg.Database.URL, 2, nil)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return nil, 1
	}
	return st, 0
}

func printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func fail(stderr io.Writer, prog string, err error) int {
	fmt.Fprintf(stderr, "%s: %v\n", prog, err)
	var inv1 *configs.InvalidError
	var inv2 *rollout.InvalidError
	if errors.As(err, &inv1) || errors.As(err, &inv2) {
		return cli.ExitUsage
	}
	return 1
}

func runConfig(args []string, stdout, stderr io.Writer) int {
	subs := map[string]int{"list": 0, "show": 1, "put": 1, "revise": 1, "diff": 3, "cat": 2}
	if len(args) == 0 {
		fmt.Fprintln(stderr, configUsage)
		return cli.ExitUsage
	}
	sub := args[0]
	npos, ok := subs[sub]
	if !ok {
		fmt.Fprintln(stderr, configUsage)
		return cli.ExitUsage
	}
	prog := "myriarchd config " + sub
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, configUsage) }
	cfgFile := fs.String("config", os.Getenv("MYRIARCH_CONFIG"), "YAML configuration file; only database.url is used")
	asJSON := fs.Bool("json", false, "print JSON, as the API does")
	typ := fs.String("type", "", "configuration type: "+strings.Join(configs.Types(), ", "))
	selector := fs.String("selector", "", "label selector over agent attributes: key=value,key2=value2")
	priority := fs.Int("priority", 0, "precedence when several configurations match an agent (highest wins, then the smallest name)")
	file := fs.String("file", "", "file with the content of the revision; - reads standard input")
	pos, err := cmdFlags(fs, args[1:])
	if err != nil {
		return cli.ExitUsage
	}
	if len(pos) != npos {
		fmt.Fprintf(stderr, "%s: takes %d argument(s), got %q\n%s\n", prog, npos, pos, configUsage)
		return cli.ExitUsage
	}
	var content []byte
	if sub == "revise" {
		switch *file {
		case "":
			fmt.Fprintf(stderr, "%s: --file is required\n", prog)
			return cli.ExitUsage
		case "-":
			content, err = io.ReadAll(os.Stdin)
		default:
			content, err = os.ReadFile(*file)
		}
		if err != nil {
			fmt.Fprintf(stderr, "%s: --file: %v\n", prog, err)
			return cli.ExitUsage
		}
	}
	revArg := func(i int) (int, bool) {
		n, err := strconv.Atoi(pos[i])
		if err != nil || n < 1 {
			fmt.Fprintf(stderr, "%s: revision %q: must be a positive integer\n", prog, pos[i])
			return 0, false
		}
		return n, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, code := openDB(ctx, prog, *cfgFile, stderr)
	if st == nil {
		return code
	}
	defer st.Close()
	svc := configs.Service{Store: st}
	switch sub {
	case "list":
		cs, err := store.ListConfigs(ctx, st.Pool)
		if err != nil {
			return fail(stderr, prog, err)
		}
		if *asJSON {
			if cs == nil {
				cs = []store.ConfigDef{}
			}
			printJSON(stdout, map[string]any{"configs": cs})
			return 0
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tTYPE\tSELECTOR\tPRIORITY\tCURRENT\tLATEST\tSOURCE")
		for _, c := range cs {
			src := c.Source
			if c.DeletedAt != nil {
				src += " (deleted)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\n", c.Name, c.Type, configs.FormatSelector(c.Selector), c.Priority, c.CurrentRevision, c.LatestRevision, src)
		}
		_ = tw.Flush()
	case "show":
		c, err := store.GetConfig(ctx, st.Pool, pos[0])
		if err != nil {
			return fail(stderr, prog, fmt.Errorf("configuration %s: %w", pos[0], err))
		}
		revs, err := store.Revisions(ctx, st.Pool, pos[0])
		if err != nil {
			return fail(stderr, prog, err)
		}
		if *asJSON {
			if revs == nil {
				revs = []store.Revision{}
			}
			printJSON(stdout, map[string]any{"config": c, "revisions": revs})
			return 0
		}
		fmt.Fprintf(stdout, "%s (%s) selector %q priority %d, current revision %d\n", c.Name, c.Type, configs.FormatSelector(c.Selector), c.Priority, c.CurrentRevision)
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "REVISION\tCREATED\tAUTHOR\tCOMMIT\tHASH")
		for _, r := range revs {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", r.Revision, r.CreatedAt.UTC().Format(time.RFC3339), r.Author, r.SourceCommit, r.Hash[:12])
		}
		_ = tw.Flush()
	case "put":
		sel, err := store.ParseSelector(*selector)
		if err != nil {
			fmt.Fprintf(stderr, "%s: --selector: %v\n", prog, err)
			return cli.ExitUsage
		}
		created, err := svc.Put(ctx, store.ConfigDef{Name: pos[0], Type: *typ, Selector: sel, Priority: *priority})
		if err != nil {
			return fail(stderr, prog, err)
		}
		verb := "updated"
		if created {
			verb = "created"
		}
		fmt.Fprintf(stdout, "%s configuration %s\n", verb, pos[0])
	case "revise":
		// Problems name the file (its line and key), not "config".
		source := *file
		if source == "-" {
			source = "standard input"
		}
		rev, created, err := svc.AddRevisionFrom(ctx, pos[0], source, string(content), revoker(), "")
		if err != nil {
			return fail(stderr, prog, err)
		}
		if !created {
			fmt.Fprintf(stdout, "unchanged: equal to revision %d of %s\n", rev.Revision, pos[0])
			return 0
		}
		fmt.Fprintf(stdout, "stored revision %d of %s (hash %s)\n", rev.Revision, pos[0], rev.Hash)
	case "diff":
		a, ok1 := revArg(1)
		b, ok2 := revArg(2)
		if !ok1 || !ok2 {
			return cli.ExitUsage
		}
		x, err := store.GetRevision(ctx, st.Pool, pos[0], a)
		if err != nil {
			return fail(stderr, prog, fmt.Errorf("revision %d of %s: %w", a, pos[0], err))
		}
		y, err := store.GetRevision(ctx, st.Pool, pos[0], b)
		if err != nil {
			return fail(stderr, prog, fmt.Errorf("revision %d of %s: %w", b, pos[0], err))
		}
		fmt.Fprint(stdout, configs.Diff(fmt.Sprintf("%s revision %d", pos[0], a), fmt.Sprintf("%s revision %d", pos[0], b), x.Content, y.Content))
	case "cat":
		n, ok := revArg(1)
		if !ok {
			return cli.ExitUsage
		}
		x, err := store.GetRevision(ctx, st.Pool, pos[0], n)
		if err != nil {
			return fail(stderr, prog, fmt.Errorf("revision %d of %s: %w", n, pos[0], err))
		}
		fmt.Fprint(stdout, x.Content)
	}
	return 0
}

func runRollout(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, rolloutUsage)
		return cli.ExitUsage
	}
	sub := args[0]
	npos := map[string]int{"create": 0, "list": 0, "show": 1, rollout.CmdPause: 1, rollout.CmdResume: 1, rollout.CmdAbort: 1, rollout.CmdRollback: 1}
	n, ok := npos[sub]
	if !ok {
		fmt.Fprintln(stderr, rolloutUsage)
		return cli.ExitUsage
	}
	prog := "myriarchd rollout " + sub
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, rolloutUsage) }
	cfgFile := fs.String("config-file", os.Getenv("MYRIARCH_CONFIG"), "YAML configuration file; only database.url is used")
	asJSON := fs.Bool("json", false, "print JSON, as the API does")
	cfgName := fs.String("config", "", "the configuration to roll out")
	forName := fs.String("for", "", "list only the rollouts of this configuration")
	to := fs.Int("to", 0, "revision to roll out (default: the newest)")
	waves := fs.String("waves", strings.Join(rollout.DefaultWaves, ","), "cumulative wave targets: a number of agents or a percentage; the last must be 100%")
	maxIn := fs.Int("max-in-progress", rollout.DefaultMaxInProgress, "agents sent the revision and not reported yet, at most")
	bake := fs.Duration("bake", rollout.DefaultBake, "time each agent must stay healthy after APPLIED before the next wave")
	applyTimeout := fs.Duration("apply-timeout", rollout.DefaultApplyTimeout, "an agent without APPLIED/FAILED report after this fails")
	policy := fs.String("failure-policy", rollout.PolicyPause, "pause or rollback")
	maxFailed := fs.Int("max-failed", 0, "more failed agents than this trip the failure policy")
	maxFailedPct := fs.Float64("max-failed-percent", 0, "more failed agents than this share (percent) trip the failure policy; 0: not used")
	selector := fs.String("selector", "", "narrows the configuration's selector: key=value,...")
	pos, err := cmdFlags(fs, args[1:])
	if err != nil {
		return cli.ExitUsage
	}
	if len(pos) != n {
		fmt.Fprintf(stderr, "%s: takes %d argument(s), got %q\n%s\n", prog, n, pos, rolloutUsage)
		return cli.ExitUsage
	}
	var id int64
	if n == 1 {
		if id, err = strconv.ParseInt(pos[0], 10, 64); err != nil || id < 1 {
			fmt.Fprintf(stderr, "%s: id %q: must be a positive integer (see `myriarchd rollout list`)\n", prog, pos[0])
			return cli.ExitUsage
		}
	}
	var req rollout.Request
	if sub == "create" {
		if *cfgName == "" {
			fmt.Fprintf(stderr, "%s: --config is required\n", prog)
			return cli.ExitUsage
		}
		sel, err := store.ParseSelector(*selector)
		if err != nil {
			fmt.Fprintf(stderr, "%s: --selector: %v\n", prog, err)
			return cli.ExitUsage
		}
		req = rollout.Request{Config: *cfgName, ToRevision: *to, Spec: rollout.Spec{Waves: strings.Split(*waves, ","), MaxInProgress: *maxIn,
			BakeS: rollout.Secs(bake.Seconds()), ApplyTimeoutS: applyTimeout.Seconds(), FailurePolicy: *policy, MaxFailed: *maxFailed,
			MaxFailedPercent: *maxFailedPct, Selector: sel}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, code := openDB(ctx, prog, *cfgFile, stderr)
	if st == nil {
		return code
	}
	defer st.Close()
	svc := rollout.Service{Store: st}
	switch sub {
	case "create":
		r, err := svc.Create(ctx, req, revoker())
		if err != nil {
			return fail(stderr, prog, err)
		}
		if *asJSON {
			printJSON(stdout, r)
			return 0
		}
		fmt.Fprintf(stdout, "rollout %d created: %s revision %d → %d; the leader plans it within jobs.rolloutInterval\n", r.ID, r.Config, r.FromRevision, r.ToRevision)
	case "list":
		rs, err := svc.List(ctx, *forName, 100)
		if err != nil {
			return fail(stderr, prog, err)
		}
		if *asJSON {
			printJSON(stdout, map[string]any{"rollouts": rs})
			return 0
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tCONFIG\tREVISIONS\tSTATE\tWAVE\tAPPLIED\tFAILED\tPENDING\tIN PROGRESS\tSKIPPED\tREASON")
		for _, r := range rs {
			fmt.Fprintf(tw, "%d\t%s\t%d → %d\t%s\t%d/%d\t%d\t%d\t%d\t%d\t%d\t%s\n", r.ID, r.Config, r.FromRevision, r.ToRevision, r.State, r.Wave, r.Waves,
				r.Counts[rollout.AgentApplied], r.Counts[rollout.AgentFailed], r.Counts[rollout.AgentPending], r.Counts[rollout.AgentInProgress],
				r.Counts[rollout.AgentSkipped], r.Reason)
		}
		_ = tw.Flush()
	case "show":
		d, err := svc.Detail(ctx, id, 1000)
		if err != nil {
			return fail(stderr, prog, fmt.Errorf("rollout %d: %w", id, err))
		}
		if *asJSON {
			printJSON(stdout, d)
			return 0
		}
		fmt.Fprintf(stdout, "rollout %d: %s revision %d → %d, %s, wave %d of %d %s\n", d.ID, d.Config, d.FromRevision, d.ToRevision, d.State, d.Wave, d.Waves, d.Reason)
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "WAVE\tSIZE\tAPPLIED\tFAILED\tPENDING\tIN PROGRESS\tSKIPPED\tGATE PASSED")
		for _, w := range d.WaveProgress {
			gate := "-"
			if w.GatePassedAt != nil {
				gate = w.GatePassedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", w.Wave, w.Size, w.Counts[rollout.AgentApplied], w.Counts[rollout.AgentFailed],
				w.Counts[rollout.AgentPending], w.Counts[rollout.AgentInProgress], w.Counts[rollout.AgentSkipped], gate)
		}
		_ = tw.Flush()
		for _, a := range d.Agents {
			if a.State == rollout.AgentFailed || a.State == rollout.AgentSkipped {
				fmt.Fprintf(stdout, "  %s %s (wave %d): %s\n", a.InstanceUID, a.State, a.Wave, a.Detail)
			}
		}
	default:
		r, err := svc.Command(ctx, id, sub)
		if err != nil {
			return fail(stderr, prog, err)
		}
		fmt.Fprintf(stdout, "rollout %d: %s requested (state %s); the leader carries it out within jobs.rolloutInterval\n", r.ID, sub, r.State)
	}
	return 0
}
