package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/myriarch/myriarch/internal/cli"
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

// withDB runs step with the store named by the configuration file, within
// a minute.
func withDB(in *invocation, cfgFile string, step func(context.Context, *store.Store) int) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, code := openDB(ctx, in.prog, cfgFile, in.stderr)
	if st == nil {
		return code
	}
	defer st.Close()
	return step(ctx, st)
}

// configCmd is one run of `myriarchd config`.
type configCmd struct {
	*invocation
	cfgFile, typ, selector, file *string
	asJSON                       *bool
	priority                     *int
	content                      []byte // revise: the revision read from --file
	svc                          configs.Service
}

// configSubs are the subcommands of config, with their number of positional
// arguments and their step after the store is open.
var configSubs = map[string]struct {
	npos int
	run  func(*configCmd, context.Context, *store.Store) int
}{
	"list": {0, (*configCmd).list}, "show": {1, (*configCmd).show}, "put": {1, (*configCmd).put},
	"revise": {1, (*configCmd).revise}, "diff": {3, (*configCmd).diff}, "cat": {2, (*configCmd).cat},
}

func runConfig(args []string, stdout, stderr io.Writer) int {
	c := &configCmd{}
	in, code := subcommand("config", configUsage, mapKeys(configSubs), args, stdout, stderr, c.define)
	if in == nil {
		return code
	}
	c.invocation = in
	sub := configSubs[in.sub]
	if !c.wantArgs(sub.npos, configUsage) {
		return cli.ExitUsage
	}
	if code, ok := c.readFile(); !ok {
		return code
	}
	return withDB(in, *c.cfgFile, func(ctx context.Context, st *store.Store) int {
		c.svc = configs.Service{Store: st}
		return sub.run(c, ctx, st)
	})
}

func (c *configCmd) define(_ string, fs *flag.FlagSet) {
	c.cfgFile = fs.String("config", os.Getenv("MYRIARCH_CONFIG"), "YAML configuration file; only database.url is used")
	c.asJSON = fs.Bool("json", false, "print JSON, as the API does")
	c.typ = fs.String("type", "", "configuration type: "+strings.Join(configs.Types(), ", "))
	c.selector = fs.String("selector", "", "label selector over agent attributes: key=value,key2=value2")
	c.priority = fs.Int("priority", 0, "precedence when several configurations match an agent (highest wins, then the smallest name)")
	c.file = fs.String("file", "", "file with the content of the revision; - reads standard input")
}

// readFile reads the revision of revise before anything else happens.
func (c *configCmd) readFile() (int, bool) {
	if c.sub != "revise" {
		return 0, true
	}
	var err error
	switch *c.file {
	case "":
		return c.usageErr("--file is required"), false
	case "-":
		c.content, err = io.ReadAll(os.Stdin)
	default:
		c.content, err = os.ReadFile(*c.file)
	}
	if err != nil {
		return c.usageErr("--file: %v", err), false
	}
	return 0, true
}

// revArg is the revision number in positional argument i.
func (c *configCmd) revArg(i int) (int, bool) {
	n, err := strconv.Atoi(c.pos[i])
	if err != nil || n < 1 {
		fmt.Fprintf(c.stderr, "%s: revision %q: must be a positive integer\n", c.prog, c.pos[i])
		return 0, false
	}
	return n, true
}

func (c *configCmd) list(ctx context.Context, st *store.Store) int {
	cs, err := store.ListConfigs(ctx, st.Pool)
	if err != nil {
		return c.fail(err)
	}
	if *c.asJSON {
		if cs == nil {
			cs = []store.ConfigDef{}
		}
		printJSON(c.stdout, map[string]any{"configs": cs})
		return 0
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTYPE\tSELECTOR\tPRIORITY\tCURRENT\tLATEST\tSOURCE")
	for _, d := range cs {
		src := d.Source
		if d.DeletedAt != nil {
			src += " (deleted)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\n", d.Name, d.Type, configs.FormatSelector(d.Selector), d.Priority, d.CurrentRevision, d.LatestRevision, src)
	}
	_ = tw.Flush()
	return 0
}

func (c *configCmd) show(ctx context.Context, st *store.Store) int {
	name := c.pos[0]
	d, err := store.GetConfig(ctx, st.Pool, name)
	if err != nil {
		return c.fail(fmt.Errorf("configuration %s: %w", name, err))
	}
	revs, err := store.Revisions(ctx, st.Pool, name)
	if err != nil {
		return c.fail(err)
	}
	if *c.asJSON {
		if revs == nil {
			revs = []store.Revision{}
		}
		printJSON(c.stdout, map[string]any{"config": d, "revisions": revs})
		return 0
	}
	fmt.Fprintf(c.stdout, "%s (%s) selector %q priority %d, current revision %d\n", d.Name, d.Type, configs.FormatSelector(d.Selector), d.Priority, d.CurrentRevision)
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REVISION\tCREATED\tAUTHOR\tCOMMIT\tHASH")
	for _, r := range revs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", r.Revision, r.CreatedAt.UTC().Format(time.RFC3339), r.Author, r.SourceCommit, r.Hash[:12])
	}
	_ = tw.Flush()
	return 0
}

func (c *configCmd) put(ctx context.Context, _ *store.Store) int {
	sel, err := store.ParseSelector(*c.selector)
	if err != nil {
		return c.usageErr("--selector: %v", err)
	}
	created, err := c.svc.Put(ctx, store.ConfigDef{Name: c.pos[0], Type: *c.typ, Selector: sel, Priority: *c.priority})
	if err != nil {
		return c.fail(err)
	}
	verb := "updated"
	if created {
		verb = "created"
	}
	fmt.Fprintf(c.stdout, "%s configuration %s\n", verb, c.pos[0])
	return 0
}

func (c *configCmd) revise(ctx context.Context, _ *store.Store) int {
	// Problems name the file (its line and key), not "config".
	source := *c.file
	if source == "-" {
		source = "standard input"
	}
	rev, created, err := c.svc.AddRevisionFrom(ctx, c.pos[0], source, string(c.content), revoker(), "")
	if err != nil {
		return c.fail(err)
	}
	if !created {
		fmt.Fprintf(c.stdout, "unchanged: equal to revision %d of %s\n", rev.Revision, c.pos[0])
		return 0
	}
	fmt.Fprintf(c.stdout, "stored revision %d of %s (hash %s)\n", rev.Revision, c.pos[0], rev.Hash)
	return 0
}

// revision reads revision n of the configuration named first.
func (c *configCmd) revision(ctx context.Context, st *store.Store, n int) (store.Revision, int, bool) {
	x, err := store.GetRevision(ctx, st.Pool, c.pos[0], n)
	if err != nil {
		return x, c.fail(fmt.Errorf("revision %d of %s: %w", n, c.pos[0], err)), false
	}
	return x, 0, true
}

func (c *configCmd) diff(ctx context.Context, st *store.Store) int {
	a, ok1 := c.revArg(1)
	b, ok2 := c.revArg(2)
	if !ok1 || !ok2 {
		return cli.ExitUsage
	}
	x, code, ok := c.revision(ctx, st, a)
	if !ok {
		return code
	}
	y, code, ok := c.revision(ctx, st, b)
	if !ok {
		return code
	}
	fmt.Fprint(c.stdout, configs.Diff(fmt.Sprintf("%s revision %d", c.pos[0], a), fmt.Sprintf("%s revision %d", c.pos[0], b), x.Content, y.Content))
	return 0
}

func (c *configCmd) cat(ctx context.Context, st *store.Store) int {
	n, ok := c.revArg(1)
	if !ok {
		return cli.ExitUsage
	}
	x, code, ok := c.revision(ctx, st, n)
	if !ok {
		return code
	}
	fmt.Fprint(c.stdout, x.Content)
	return 0
}

// rolloutCmd is one run of `myriarchd rollout`.
type rolloutCmd struct {
	*invocation
	cfgFile, cfgName, forName, waves, policy, selector *string
	asJSON                                             *bool
	to, maxIn, maxFailed                               *int
	bake, applyTimeout                                 *time.Duration
	maxFailedPct                                       *float64
	id                                                 int64           // the rollout of show and the commands
	req                                                rollout.Request // create
	svc                                                rollout.Service
}

// rolloutArgs are the subcommands of rollout with their number of
// positional arguments; every other one is a command to a rollout.
var rolloutArgs = map[string]int{"create": 0, "list": 0, "show": 1, rollout.CmdPause: 1, rollout.CmdResume: 1, rollout.CmdAbort: 1, rollout.CmdRollback: 1}

func runRollout(args []string, stdout, stderr io.Writer) int {
	r := &rolloutCmd{}
	in, code := subcommand("rollout", rolloutUsage, mapKeys(rolloutArgs), args, stdout, stderr, r.define)
	if in == nil {
		return code
	}
	r.invocation = in
	if code, ok := r.check(); !ok {
		return code
	}
	return withDB(in, *r.cfgFile, func(ctx context.Context, st *store.Store) int {
		r.svc = rollout.Service{Store: st}
		switch r.sub {
		case "create":
			return r.create(ctx)
		case "list":
			return r.list(ctx)
		case "show":
			return r.show(ctx)
		default:
			return r.command(ctx)
		}
	})
}

func (r *rolloutCmd) define(_ string, fs *flag.FlagSet) {
	r.cfgFile = fs.String("config-file", os.Getenv("MYRIARCH_CONFIG"), "YAML configuration file; only database.url is used")
	r.asJSON = fs.Bool("json", false, "print JSON, as the API does")
	r.cfgName = fs.String("config", "", "the configuration to roll out")
	r.forName = fs.String("for", "", "list only the rollouts of this configuration")
	r.to = fs.Int("to", 0, "revision to roll out (default: the newest)")
	r.waves = fs.String("waves", strings.Join(rollout.DefaultWaves, ","), "cumulative wave targets: a number of agents or a percentage; the last must be 100%")
	r.maxIn = fs.Int("max-in-progress", rollout.DefaultMaxInProgress, "agents sent the revision and not reported yet, at most")
	r.bake = fs.Duration("bake", rollout.DefaultBake, "time each agent must stay healthy after APPLIED before the next wave")
	r.applyTimeout = fs.Duration("apply-timeout", rollout.DefaultApplyTimeout, "an agent without APPLIED/FAILED report after this fails")
	r.policy = fs.String("failure-policy", rollout.PolicyPause, "pause or rollback")
	r.maxFailed = fs.Int("max-failed", 0, "more failed agents than this trip the failure policy")
	r.maxFailedPct = fs.Float64("max-failed-percent", 0, "more failed agents than this share (percent) trip the failure policy; 0: not used")
	r.selector = fs.String("selector", "", "narrows the configuration's selector: key=value,...")
}

// check validates the command line before the store is opened: the
// number of arguments, the rollout id, and the request of create.
func (r *rolloutCmd) check() (int, bool) {
	n := rolloutArgs[r.sub]
	if !r.wantArgs(n, rolloutUsage) {
		return cli.ExitUsage, false
	}
	if n == 1 {
		var err error
		if r.id, err = strconv.ParseInt(r.pos[0], 10, 64); err != nil || r.id < 1 {
			return r.usageErr("id %q: must be a positive integer (see `myriarchd rollout list`)", r.pos[0]), false
		}
	}
	if r.sub != "create" {
		return 0, true
	}
	if *r.cfgName == "" {
		return r.usageErr("--config is required"), false
	}
	sel, err := store.ParseSelector(*r.selector)
	if err != nil {
		return r.usageErr("--selector: %v", err), false
	}
	r.req = rollout.Request{Config: *r.cfgName, ToRevision: *r.to, Spec: rollout.Spec{Waves: strings.Split(*r.waves, ","), MaxInProgress: *r.maxIn,
		BakeS: rollout.Secs(r.bake.Seconds()), ApplyTimeoutS: r.applyTimeout.Seconds(), FailurePolicy: *r.policy, MaxFailed: *r.maxFailed,
		MaxFailedPercent: *r.maxFailedPct, Selector: sel}}
	return 0, true
}

func (r *rolloutCmd) create(ctx context.Context) int {
	ro, err := r.svc.Create(ctx, r.req, revoker())
	if err != nil {
		return r.fail(err)
	}
	if *r.asJSON {
		printJSON(r.stdout, ro)
		return 0
	}
	fmt.Fprintf(r.stdout, "rollout %d created: %s revision %d → %d; the leader plans it within jobs.rolloutInterval\n", ro.ID, ro.Config, ro.FromRevision, ro.ToRevision)
	return 0
}

func (r *rolloutCmd) list(ctx context.Context) int {
	rs, err := r.svc.List(ctx, *r.forName, 100)
	if err != nil {
		return r.fail(err)
	}
	if *r.asJSON {
		printJSON(r.stdout, map[string]any{"rollouts": rs})
		return 0
	}
	tw := tabwriter.NewWriter(r.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCONFIG\tREVISIONS\tSTATE\tWAVE\tAPPLIED\tFAILED\tPENDING\tIN PROGRESS\tSKIPPED\tREASON")
	for _, ro := range rs {
		fmt.Fprintf(tw, "%d\t%s\t%d → %d\t%s\t%d/%d\t%s\t%s\n", ro.ID, ro.Config, ro.FromRevision, ro.ToRevision, ro.State, ro.Wave, ro.Waves,
			agentCounts(ro.Counts), ro.Reason)
	}
	_ = tw.Flush()
	return 0
}

func (r *rolloutCmd) show(ctx context.Context) int {
	d, err := r.svc.Detail(ctx, r.id, 1000)
	if err != nil {
		return r.fail(fmt.Errorf("rollout %d: %w", r.id, err))
	}
	if *r.asJSON {
		printJSON(r.stdout, d)
		return 0
	}
	fmt.Fprintf(r.stdout, "rollout %d: %s revision %d → %d, %s, wave %d of %d %s\n", d.ID, d.Config, d.FromRevision, d.ToRevision, d.State, d.Wave, d.Waves, d.Reason)
	tw := tabwriter.NewWriter(r.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WAVE\tSIZE\tAPPLIED\tFAILED\tPENDING\tIN PROGRESS\tSKIPPED\tGATE PASSED")
	for _, w := range d.WaveProgress {
		gate := "-"
		if w.GatePassedAt != nil {
			gate = w.GatePassedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\n", w.Wave, w.Size, agentCounts(w.Counts), gate)
	}
	_ = tw.Flush()
	for _, a := range d.Agents {
		if a.State == rollout.AgentFailed || a.State == rollout.AgentSkipped {
			fmt.Fprintf(r.stdout, "  %s %s (wave %d): %s\n", a.InstanceUID, a.State, a.Wave, a.Detail)
		}
	}
	return 0
}

func (r *rolloutCmd) command(ctx context.Context) int {
	ro, err := r.svc.Command(ctx, r.id, r.sub)
	if err != nil {
		return r.fail(err)
	}
	fmt.Fprintf(r.stdout, "rollout %d: %s requested (state %s); the leader carries it out within jobs.rolloutInterval\n", ro.ID, r.sub, ro.State)
	return 0
}

// agentCounts is the tab-separated columns APPLIED to SKIPPED of a rollout
// or a wave.
func agentCounts(n map[string]int) string {
	return fmt.Sprintf("%d\t%d\t%d\t%d\t%d", n[rollout.AgentApplied], n[rollout.AgentFailed], n[rollout.AgentPending], n[rollout.AgentInProgress], n[rollout.AgentSkipped])
}
