package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/fleet/api"
	"github.com/myriarch/myriarch/internal/fleet/apiclient"
)

func init() {
	apiCommands = append(apiCommands,
		apiCmd{group: "cluster", summary: "replicas, leader, leader jobs (GET /api/v1/cluster)",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				ci, err := c.Cluster(ctx)
				return ci, func(w io.Writer) { printCluster(w, ci) }, err
			}},
		apiCmd{group: "overview", summary: "agent counts and the leader (GET /api/v1/overview)",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				o, err := c.Overview(ctx)
				return o, func(w io.Writer) {
					leader := "none"
					if o.Leader != nil {
						leader = fmt.Sprintf("%s (term %d)", o.Leader.ID, o.Leader.Term)
					}
					fmt.Fprintf(w, "agents     %d: %d online, %d offline, %d unhealthy\nleader     %s\nanswered   by %s\n",
						o.Counts.Total, o.Counts.Online, o.Counts.Offline, o.Counts.Unhealthy, leader, o.ReplicaID)
				}, err
			}},
		apiCmd{group: "openapi", summary: "the API's OpenAPI 3.1 document (GET /api/v1/openapi.json)",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				b, err := c.OpenAPI(ctx)
				return json.RawMessage(b), func(w io.Writer) { w.Write(b) }, err
			}},
	)
	registerGroup("cluster", "the replicas, the leader and its jobs (GET /api/v1/cluster)", "", nil)
	registerGroup("overview", "agent counts and the leader (GET /api/v1/overview)", "", nil)
	registerGroup("openapi", "print the API's OpenAPI 3.1 document (GET /api/v1/openapi.json)", "", nil)
	commands.Register(cli.Command{Name: "context", Summary: "clusters in the contexts file: context set NAME --server URL --token T | use NAME | list | show [NAME] | delete NAME", Run: runContext})
}

func printCluster(w io.Writer, c api.ClusterInfo) {
	leader := "none"
	if c.Leader != nil {
		leader = fmt.Sprintf("%s (term %d, active %v)", c.Leader.ID, c.Leader.Term, c.Leader.Active)
	}
	fmt.Fprintf(w, "answered by %s; leader %s\n", c.ReplicaID, leader)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REPLICA\tHOST\tVERSION\tSTARTED\tHEARTBEAT AGE\tLEADER\tHOLDS LOCK\tSTALE")
	for _, r := range c.Replicas {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1fs\t%v\t%v\t%v\n", r.ID, r.Host, r.Version, ts(&r.StartedAt), r.AgeS, r.IsLeader, r.HoldsLock, r.Stale)
	}
	_ = tw.Flush()
}

const contextUsage = `Usage:
  myriarchd context set NAME [--server URL] [--token TOKEN] [--ca-file FILE]
  myriarchd context use NAME
  myriarchd context list
  myriarchd context show [NAME]      (the token is not shown)
  myriarchd context delete NAME
The contexts file is $MYRIARCH_CONTEXTS, else ~/.config/myriarch/contexts.yaml;
it holds tokens and must be readable by its owner only (mode 0600; myriarchd
writes it so and refuses to read a file that others can). A command's
--server/--token/--ca-file win, then --context NAME, then MYRIARCH_SERVER/
MYRIARCH_TOKEN/MYRIARCH_CA_FILE, then the current context.`

var contextArgs = map[string]int{"set": 1, "use": 1, "list": 0, "show": -1, "delete": 1}

func runContext(args []string, stdout, stderr io.Writer) int {
	var server, token, caFile *string
	in, code := subcommand("context", contextUsage, mapKeys(contextArgs), args, stdout, stderr, func(sub string, fs *flag.FlagSet) {
		if sub == "set" {
			server = fs.String("server", "", "base URL of a replica's API")
			token = fs.String("token", "", "API token")
			caFile = fs.String("ca-file", "", "PEM CA bundle of the server's certificate")
		}
	})
	if in == nil {
		return code
	}
	n := contextArgs[in.sub]
	if (n >= 0 && len(in.pos) != n) || (n < 0 && len(in.pos) > 1) {
		return in.usageErr("wrong number of arguments %q\n%s", in.pos, contextUsage)
	}
	path, err := apiclient.ContextsPath()
	if err != nil {
		return in.usageErr("%v", err)
	}
	cs, err := apiclient.LoadContexts(path)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", in.prog, err)
		return 1
	}
	save := func(msg string) int {
		if err := cs.Save(); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", in.prog, err)
			return 1
		}
		fmt.Fprintln(stdout, msg)
		return 0
	}
	switch in.sub {
	case "set":
		x, _ := cs.Get(in.pos[0])
		x.Name = in.pos[0]
		if *server != "" {
			x.Server = *server
		}
		if *token != "" {
			x.Token = *token
		}
		if *caFile != "" {
			x.CAFile = *caFile
		}
		if x.Server == "" {
			return in.usageErr("--server is required for a new context")
		}
		if _, err := apiclient.New(apiclient.Options{Server: x.Server, Token: "x", CAFile: x.CAFile}); err != nil {
			return in.usageErr("%v", err)
		}
		cs.Set(x)
		return save(fmt.Sprintf("context %s set in %s (current: %s)", x.Name, path, cs.Current))
	case "use":
		if _, ok := cs.Get(in.pos[0]); !ok {
			fmt.Fprintf(stderr, "%s: no context %q in %s\n", in.prog, in.pos[0], path)
			return 1
		}
		cs.Current = in.pos[0]
		return save("current context: " + in.pos[0])
	case "delete":
		if !cs.Delete(in.pos[0]) {
			fmt.Fprintf(stderr, "%s: no context %q in %s\n", in.prog, in.pos[0], path)
			return 1
		}
		return save("deleted context " + in.pos[0])
	case "list":
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CURRENT\tNAME\tSERVER\tCA FILE")
		for _, x := range cs.Contexts {
			cur := ""
			if x.Name == cs.Current {
				cur = "*"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", cur, x.Name, x.Server, x.CAFile)
		}
		_ = tw.Flush()
		return 0
	default: // show
		name := cs.Current
		if len(in.pos) == 1 {
			name = in.pos[0]
		}
		x, ok := cs.Get(name)
		if !ok {
			fmt.Fprintf(stderr, "%s: no context %q in %s\n", in.prog, name, path)
			return 1
		}
		tok := "(none)"
		if x.Token != "" {
			tok = "(set, not shown)"
		}
		fmt.Fprintf(stdout, "name     %s\nserver   %s\ntoken    %s\nca file  %s\nfile     %s\n", x.Name, x.Server, tok, x.CAFile, path)
		return 0
	}
}
