package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/fleet/config"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// The command-line steps that the subcommands of this program share.

// invocation is one run of a two-word command (config list, token create,
// agent show, ...) after its flags are parsed.
type invocation struct {
	prog           string // "myriarchd config list": the prefix of its messages
	sub            string
	pos            []string // positional arguments, in order
	stdout, stderr io.Writer
}

// subcommand starts an invocation of group's subcommand args[0], which
// must be one of subs (otherwise it prints usage and returns ExitUsage).
// define adds the flags of that subcommand; they may stand before and
// after the positional arguments.
func subcommand(group, usage string, subs []string, args []string, stdout, stderr io.Writer,
	define func(sub string, fs *flag.FlagSet)) (*invocation, int) {
	if len(args) == 0 || !slices.Contains(subs, args[0]) {
		fmt.Fprintln(stderr, usage)
		return nil, cli.ExitUsage
	}
	in := &invocation{prog: "myriarchd " + group + " " + args[0], sub: args[0], stdout: stdout, stderr: stderr}
	fs := cli.NewFlagSet(in.prog, usage, stderr)
	define(in.sub, fs)
	pos, err := cli.ParseInterspersed(fs, args[1:])
	if err != nil {
		return nil, cli.ExitUsage
	}
	in.pos = pos
	return in, 0
}

// usageErr reports a refused command line and returns ExitUsage.
func (in *invocation) usageErr(format string, a ...any) int {
	fmt.Fprintf(in.stderr, in.prog+": "+format+"\n", a...)
	return cli.ExitUsage
}

// loadConfig loads the configuration; a refused one is printed with one
// problem a line and is ExitUsage.
func loadConfig(src config.Source, stderr io.Writer) (*config.Config, int) {
	cfg, err := config.Load(src)
	if err != nil {
		fmt.Fprintln(stderr, "myriarchd: invalid configuration:")
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintln(stderr, "  "+line)
		}
		return nil, cli.ExitUsage
	}
	return cfg, 0
}

// openDB loads the configuration file (database.url only) and opens the store.
func openDB(ctx context.Context, prog, file string, stderr io.Writer) (*store.Store, int) {
	cfg, code := loadConfig(config.Source{File: file, Optional: []string{"server.enrollmentSecret"}}, stderr)
	if cfg == nil {
		return nil, code
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

// mapKeys is the names of a table of subcommands.
func mapKeys[V any](m map[string]V) []string { return slices.Collect(maps.Keys(m)) }
