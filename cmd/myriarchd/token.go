package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/fleet/config"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

func init() {
	commands.Register(cli.Command{
		Name:    "token",
		Summary: "manage API tokens: token create --name NAME | token list | token revoke ID",
		Run:     runToken,
	})
}

const tokenUsage = `Usage:
  myriarchd token create --name NAME [--role viewer|operator|admin] [--config FILE]
  myriarchd token list [--status active|revoked] [--json] [--config FILE]
  myriarchd token revoke ID [--config FILE]
Roles: viewer reads; operator also changes configurations and sends agent
commands; admin also manages tokens and agents' credentials (default admin).
Only database.url of the configuration is used. A revoked token is refused
at once by every replica.`

func runToken(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "create" && args[0] != "list" && args[0] != "revoke") {
		fmt.Fprintln(stderr, tokenUsage)
		return cli.ExitUsage
	}
	sub := args[0]
	fs := flag.NewFlagSet("token "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, tokenUsage) }
	cfgFile := fs.String("config", os.Getenv("MYRIARCH_CONFIG"), "YAML configuration file (env MYRIARCH_CONFIG); only database.url is used")
	var name, status, role *string
	var asJSON *bool
	switch sub {
	case "create":
		name = fs.String("name", "", "name of the token (shown in logs of the requests it makes)")
		role = fs.String("role", string(store.RoleAdmin), "viewer, operator or admin")
	case "list":
		status = fs.String("status", "", "list only the active or the revoked tokens")
		asJSON = fs.Bool("json", false, "print JSON, as GET /api/v1/tokens does")
	}
	// Flags may come before and after the positional id of revoke.
	var pos []string
	rest := args[1:]
	for {
		if err := fs.Parse(rest); err != nil {
			return cli.ExitUsage
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	var id int64
	switch sub {
	case "create":
		if *name == "" {
			fmt.Fprintln(stderr, "myriarchd token create: --name is required")
			return cli.ExitUsage
		}
		if _, err := store.ParseRole(*role); err != nil {
			fmt.Fprintln(stderr, "myriarchd token create: --"+err.Error())
			return cli.ExitUsage
		}
	case "list":
		if *status != store.TokensAll && *status != store.TokensActive && *status != store.TokensRevoked {
			fmt.Fprintf(stderr, "myriarchd token list: --status %q: must be active or revoked\n", *status)
			return cli.ExitUsage
		}
	case "revoke":
		if len(pos) != 1 {
			fmt.Fprintln(stderr, "myriarchd token revoke: give exactly one token id (see `myriarchd token list`)")
			return cli.ExitUsage
		}
		var err error
		if id, err = strconv.ParseInt(pos[0], 10, 64); err != nil || id < 1 {
			fmt.Fprintf(stderr, "myriarchd token revoke: id %q: must be a positive integer (see `myriarchd token list`)\n", pos[0])
			return cli.ExitUsage
		}
	}
	if sub != "revoke" && len(pos) > 0 {
		fmt.Fprintf(stderr, "myriarchd token %s: unexpected arguments %q\n", sub, pos)
		return cli.ExitUsage
	}
	cfg, err := config.Load(config.Source{File: *cfgFile, Optional: []string{"server.enrollmentSecret"}})
	if err != nil {
		fmt.Fprintln(stderr, "myriarchd: invalid configuration:")
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintln(stderr, "  "+line)
		}
		return cli.ExitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := store.Open(ctx, cfg.Database.URL, 2, nil)
	if err != nil {
		fmt.Fprintf(stderr, "myriarchd token %s: %v\n", sub, err)
		return 1
	}
	defer st.Close()
	switch sub {
	case "create":
		t, tok, err := st.IssueTokenRole(ctx, *name, store.Role(*role))
		if err != nil {
			fmt.Fprintln(stderr, "myriarchd token create:", err)
			return 1
		}
		fmt.Fprintln(stdout, tok)
		fmt.Fprintf(stderr, "Token id %d (%s, role %s). Store this token now: only its hash is kept in the database.\nRevoke it with `myriarchd token revoke %d`.\n", t.ID, t.Name, t.Role, t.ID)
		return 0
	case "list":
		toks, err := st.ListTokens(ctx, *status)
		if err != nil {
			fmt.Fprintln(stderr, "myriarchd token list:", err)
			return 1
		}
		if *asJSON {
			if toks == nil {
				toks = []store.Token{}
			}
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(map[string]any{"tokens": toks})
			return 0
		}
		printTokens(stdout, toks)
		return 0
	default:
		t, revoked, err := st.RevokeToken(ctx, id, revoker())
		if errors.Is(err, store.ErrNotFound) {
			fmt.Fprintf(stderr, "myriarchd token revoke: no token with id %d\n", id)
			return 1
		}
		if err != nil {
			fmt.Fprintln(stderr, "myriarchd token revoke:", err)
			return 1
		}
		if !revoked {
			fmt.Fprintf(stdout, "token %d (%s) was already revoked at %s by %s\n", t.ID, t.Name, t.RevokedAt.UTC().Format(time.RFC3339), t.RevokedBy)
			return 0
		}
		fmt.Fprintf(stdout, "revoked token %d (%s); every replica refuses it from now on\n", t.ID, t.Name)
		return 0
	}
}

// revoker is what revoked_by records for the command line.
func revoker() string {
	who := "command line"
	if u, err := user.Current(); err == nil && u.Username != "" {
		who += " (" + u.Username + ")"
	}
	return who
}

func printTokens(w io.Writer, toks []store.Token) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tROLE\tCREATED\tLAST USED\tSTATUS")
	ts := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.UTC().Format(time.RFC3339)
	}
	for _, t := range toks {
		status := "active"
		if t.RevokedAt != nil {
			status = "revoked " + ts(t.RevokedAt) + " by " + t.RevokedBy
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Name, t.Role, ts(&t.CreatedAt), ts(t.LastUsedAt), status)
	}
	_ = tw.Flush()
}
