package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/fleet/apiclient"
)

// The commands that call the REST API of a replica. Each is one row of
// apiCommands (declared next to its group: agentcmd.go, configcmd.go,
// ...): its positional arguments, its own flags, and a step that calls
// one typed method of internal/fleet/apiclient and returns the answer.
// Every one of them takes the same flags:
//
//	--server URL     (MYRIARCH_SERVER; the current context's; http://127.0.0.1:8080)
//	--token TOKEN    (MYRIARCH_TOKEN; the current context's)
//	--context NAME   (a context of the contexts file)
//	--ca-file FILE   (MYRIARCH_CA_FILE; a private CA of an https:// server)
//	-o, --output table|json|yaml
//
// None opens the database: TestAPICommandsNeverOpenTheDatabase runs every
// row against a replica with the database settings pointing at a
// listener that records connections.

// apiCmd is one command that calls the API.
type apiCmd struct {
	group, name string
	// args are the positional arguments' names; one in brackets is
	// optional (only the last).
	args    []string
	summary string
	// flags are the command's own flags: name → usage. Values are read
	// with the typed getters of apiCall, which refuse a bad one.
	flags map[string]string
	// run calls the API and returns the answer and how to show it to a
	// person (nil: as YAML).
	run func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error)
}

// apiCommands is every API command, in usage order.
var apiCommands []apiCmd

// apiCall is one run of an apiCmd after its command line was parsed.
type apiCall struct {
	*invocation
	cmd    *apiCmd
	fs     *flag.FlagSet
	output string
	bad    []string // refused flag values
}

// arg is positional argument i ("" when an optional one is absent).
func (x *apiCall) arg(i int) string {
	if i < len(x.pos) {
		return x.pos[i]
	}
	return ""
}

// str is the value of flag name.
func (x *apiCall) str(name string) string { return x.fs.Lookup(name).Value.String() }

// set reports whether flag name was given.
func (x *apiCall) set(name string) bool {
	given := false
	x.fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// integer is flag name as an integer (def when absent); a bad one is
// recorded and refused before the API is called.
func (x *apiCall) integer(name string, def int) int {
	v := x.str(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		x.bad = append(x.bad, fmt.Sprintf("--%s %q: must be an integer", name, v))
	}
	return n
}

// number is flag name as a number (def when absent).
func (x *apiCall) number(name string, def float64) float64 {
	v := x.str(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseFloat(v, 64)
	if err != nil {
		x.bad = append(x.bad, fmt.Sprintf("--%s %q: must be a number", name, v))
	}
	return n
}

// duration is flag name as a duration (def when absent).
func (x *apiCall) duration(name string, def time.Duration) time.Duration {
	v := x.str(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		x.bad = append(x.bad, fmt.Sprintf("--%s %q: must be a duration such as 30s or 5m", name, v))
	}
	return d
}

// id is positional argument i as a positive integer id.
func (x *apiCall) id(i int, listCmd string) int64 {
	n, err := strconv.ParseInt(x.arg(i), 10, 64)
	if err != nil || n < 1 {
		x.bad = append(x.bad, fmt.Sprintf("id %q: must be a positive integer (see `myriarchd %s`)", x.arg(i), listCmd))
	}
	return n
}

// revision is positional argument i as a revision number.
func (x *apiCall) revision(i int) int {
	n, err := strconv.Atoi(x.arg(i))
	if err != nil || n < 1 {
		x.bad = append(x.bad, fmt.Sprintf("revision %q: must be a positive integer", x.arg(i)))
	}
	return n
}

// revisionOrEmpty is revision, where 0 also stands for the empty document
// (the side a diff of the first revision starts from).
func (x *apiCall) revisionOrEmpty(i int) int {
	n, err := strconv.Atoi(x.arg(i))
	if err != nil || n < 0 {
		x.bad = append(x.bad, fmt.Sprintf("revision %q: must be 0 (the empty document) or a positive integer", x.arg(i)))
	}
	return n
}

// errBadInput is returned by a step that recorded refused input in x.bad.
var errBadInput = errors.New("bad input")

// refused returns errBadInput when a getter refused a value.
func (x *apiCall) refused() error {
	if len(x.bad) > 0 {
		return errBadInput
	}
	return nil
}

// commonFlags are the flags of every API command.
type commonFlags struct {
	server, token, context, caFile, output *string
}

func (f *commonFlags) define(fs *flag.FlagSet) {
	f.server = fs.String("server", "", "base URL of a replica's API (env MYRIARCH_SERVER; default: the current context's, else "+apiclient.DefaultServer+")")
	f.token = fs.String("token", "", "API token (env MYRIARCH_TOKEN; default: the current context's)")
	f.context = fs.String("context", "", "use this context of the contexts file (myriarchd context list)")
	f.caFile = fs.String("ca-file", "", "PEM CA bundle of the server's certificate (env MYRIARCH_CA_FILE)")
	f.output = fs.String("output", "table", "table, json or yaml")
	fs.StringVar(f.output, "o", "table", "shorthand of --output")
}

// groupUsage is the usage text of group: every command of it.
func groupUsage(group, intro string, extra ...string) string {
	var b strings.Builder
	b.WriteString("Usage:\n")
	for _, c := range apiCommands {
		if c.group != group {
			continue
		}
		line := "  myriarchd " + group
		if c.name != "" {
			line += " " + c.name
		}
		for _, a := range c.args {
			line += " " + a
		}
		names := make([]string, 0, len(c.flags))
		for n := range c.flags {
			names = append(names, "--"+n+" X")
		}
		slices.Sort(names)
		if len(names) > 0 {
			line += " [" + strings.Join(names, "] [") + "]"
		}
		fmt.Fprintf(&b, "%s\n      %s\n", line, c.summary)
	}
	for _, e := range extra {
		b.WriteString(e + "\n")
	}
	b.WriteString(`Flags of every command: --server URL (MYRIARCH_SERVER), --token TOKEN
(MYRIARCH_TOKEN), --context NAME, --ca-file FILE (MYRIARCH_CA_FILE),
-o/--output table|json|yaml. Without --server/--token, the environment, then
the current context of the contexts file (myriarchd context) name them.`)
	if intro != "" {
		b.WriteString("\n" + intro)
	}
	return b.String()
}

// registerGroup registers the command group: its API commands, and local
// ones (context, token bootstrap) in local.
func registerGroup(group, summary, intro string, local map[string]func(args []string, stdout, stderr io.Writer) int, extraUsage ...string) {
	commands.Register(cli.Command{Name: group, Summary: summary, Run: func(args []string, stdout, stderr io.Writer) int {
		usage := groupUsage(group, intro, extraUsage...)
		if len(args) > 0 {
			if run, ok := local[args[0]]; ok {
				return run(args[1:], stdout, stderr)
			}
		}
		var cmd *apiCmd
		for i := range apiCommands {
			c := &apiCommands[i]
			if c.group == group && (c.name == "" || (len(args) > 0 && args[0] == c.name)) {
				cmd = c
				break
			}
		}
		if cmd == nil {
			fmt.Fprintln(stderr, usage)
			return cli.ExitUsage
		}
		if cmd.name == "" {
			args = append([]string{""}, args...)
		}
		return runAPI(cmd, usage, args, stdout, stderr)
	}})
}

// runAPI parses the command line of cmd (args[0] is its name), resolves
// the server and token, calls the API and prints the answer.
func runAPI(cmd *apiCmd, usage string, args []string, stdout, stderr io.Writer) int {
	var common commonFlags
	var fs *flag.FlagSet
	in, code := subcommand(cmd.group, usage, []string{cmd.name}, args, stdout, stderr, func(_ string, f *flag.FlagSet) {
		fs = f
		common.define(f)
		for n, u := range cmd.flags {
			f.String(n, "", u)
		}
	})
	if in == nil {
		return code
	}
	in.prog = strings.TrimSuffix(in.prog, " ")
	x := &apiCall{invocation: in, cmd: cmd, fs: fs, output: *common.output}
	if x.output != "table" && x.output != "json" && x.output != "yaml" {
		return in.usageErr("--output %q: must be table, json or yaml", x.output)
	}
	need, optional := len(cmd.args), 0
	if need > 0 && strings.HasPrefix(cmd.args[need-1], "[") {
		optional = 1
	}
	if len(in.pos) < need-optional || len(in.pos) > need {
		return in.usageErr("takes %s, got %q\n%s", argsText(cmd.args), in.pos, usage)
	}
	o, err := apiclient.Resolve{Server: *common.server, Token: *common.token, Context: *common.context, CAFile: *common.caFile}.Options()
	if err != nil {
		return in.usageErr("%v", err)
	}
	o.Transport = apiTransport
	c, err := apiclient.New(o)
	if err != nil {
		return in.usageErr("%v", err)
	}
	if c.PlainHTTP() {
		// A warning, not a refusal: a lab on a private network is a
		// choice; stdout (-o json) stays clean.
		fmt.Fprintf(stderr, "%s: warning: the API token goes in clear text over http:// to %s (not this machine): use https:// (server.httpTlsCertFile) outside a trusted network\n", in.prog, c.Server())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v, human, err := cmd.run(ctx, c, x)
	if len(x.bad) > 0 {
		for _, b := range x.bad {
			fmt.Fprintf(stderr, "%s: %s\n", in.prog, b)
		}
		return cli.ExitUsage
	}
	if err != nil {
		return x.apiErr(err)
	}
	return x.print(v, human)
}

// locatedRE finds the first located problem in a server's message.
var locatedRE = regexp.MustCompile(`config:\d+:`)

// apiTransport is the HTTP transport of the API commands; nil: the
// client's own (tests validate every answer against the OpenAPI document).
var apiTransport http.RoundTripper

func argsText(args []string) string {
	if len(args) == 0 {
		return "no arguments"
	}
	return strings.Join(args, " ")
}

// apiErr reports a failed call. A refusal of the server names its
// problems, with the file and line when it located them (file is the
// name the content was read from: the server calls it "config"); refused
// input (400, 422) is ExitUsage, anything else 1.
func (x *apiCall) apiErr(err error) int {
	var e *apiclient.Error
	if !errors.As(err, &e) {
		fmt.Fprintf(x.stderr, "%s: %v\n", x.prog, err)
		return 1
	}
	// The located problems are listed under the message's head, each
	// with the file the content was read from (the server calls it
	// "config").
	head := e.Message
	if i := locatedRE.FindStringIndex(head); i != nil && len(e.Problems) > 0 {
		head = strings.TrimRight(head[:i[0]], ": ")
	}
	fmt.Fprintf(x.stderr, "%s: %s (HTTP %d)\n", x.prog, head, e.Status)
	for _, p := range e.Problems {
		file := p.File
		if file == "config" && x.set("file") {
			if file = x.str("file"); file == "-" {
				file = "standard input"
			}
		}
		loc := file
		if p.Line > 0 {
			loc += ":" + strconv.Itoa(p.Line)
		}
		if p.Field != "" {
			loc += ": " + p.Field
		}
		fmt.Fprintf(x.stderr, "  %s: %s\n", loc, p.Message)
	}
	if e.Status == http.StatusBadRequest || e.Status == http.StatusUnprocessableEntity {
		return cli.ExitUsage
	}
	return 1
}

// print writes the answer v: as JSON or YAML for scripts, else human.
func (x *apiCall) print(v any, human func(io.Writer)) int {
	var b []byte
	switch raw := v.(type) {
	case json.RawMessage:
		b = raw
	case []byte:
		b = raw
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			fmt.Fprintf(x.stderr, "%s: %v\n", x.prog, err)
			return 1
		}
	}
	switch {
	case x.output == "json":
		var out any
		if err := json.Unmarshal(b, &out); err != nil {
			x.stdout.Write(b)
			return 0
		}
		printJSON(x.stdout, out)
	case x.output == "yaml" || human == nil:
		if v == nil {
			return 0
		}
		y, err := yaml.JSONToYAML(b)
		if err != nil {
			fmt.Fprintf(x.stderr, "%s: %v\n", x.prog, err)
			return 1
		}
		x.stdout.Write(y)
	default:
		human(x.stdout)
	}
	return 0
}

// withFile is the run of a command that sends the content of --file (- for
// standard input); send gets it once the flags were accepted.
func withFile(send func(context.Context, *apiclient.Client, *apiCall, string) (any, func(io.Writer), error)) func(context.Context, *apiclient.Client, *apiCall) (any, func(io.Writer), error) {
	return func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
		content := x.readFile()
		if err := x.refused(); err != nil {
			return nil, nil, err
		}
		return send(ctx, c, x, content)
	}
}
