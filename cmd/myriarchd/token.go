package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/myriarch/myriarch/internal/cli"
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

// tokenCmd is one run of `myriarchd token`.
type tokenCmd struct {
	*invocation
	cfgFile, name, status, role *string
	asJSON                      *bool
	id                          int64 // revoke
}

func runToken(args []string, stdout, stderr io.Writer) int {
	t := &tokenCmd{}
	in, code := subcommand("token", tokenUsage, []string{"create", "list", "revoke"}, args, stdout, stderr, t.define)
	if in == nil {
		return code
	}
	t.invocation = in
	if code, ok := t.check(); !ok {
		return code
	}
	return withDB(in, *t.cfgFile, func(ctx context.Context, st *store.Store) int {
		switch t.sub {
		case "create":
			return t.create(ctx, st)
		case "list":
			return t.list(ctx, st)
		default:
			return t.revoke(ctx, st)
		}
	})
}

func (t *tokenCmd) define(sub string, fs *flag.FlagSet) {
	t.cfgFile = fs.String("config", os.Getenv("MYRIARCH_CONFIG"), "YAML configuration file (env MYRIARCH_CONFIG); only database.url is used")
	switch sub {
	case "create":
		t.name = fs.String("name", "", "name of the token (shown in logs of the requests it makes)")
		t.role = fs.String("role", string(store.RoleAdmin), "viewer, operator or admin")
	case "list":
		t.status = fs.String("status", "", "list only the active or the revoked tokens")
		t.asJSON = fs.Bool("json", false, "print JSON, as GET /api/v1/tokens does")
	}
}

// check validates the command line before the store is opened.
func (t *tokenCmd) check() (int, bool) {
	switch t.sub {
	case "create":
		if *t.name == "" {
			return t.usageErr("--name is required"), false
		}
		if _, err := store.ParseRole(*t.role); err != nil {
			return t.usageErr("--%v", err), false
		}
	case "list":
		if *t.status != store.TokensAll && *t.status != store.TokensActive && *t.status != store.TokensRevoked {
			return t.usageErr("--status %q: must be active or revoked", *t.status), false
		}
	case "revoke":
		if len(t.pos) != 1 {
			return t.usageErr("give exactly one token id (see `myriarchd token list`)"), false
		}
		var err error
		if t.id, err = strconv.ParseInt(t.pos[0], 10, 64); err != nil || t.id < 1 {
			return t.usageErr("id %q: must be a positive integer (see `myriarchd token list`)", t.pos[0]), false
		}
	}
	if t.sub != "revoke" && len(t.pos) > 0 {
		return t.usageErr("unexpected arguments %q", t.pos), false
	}
	return 0, true
}

func (t *tokenCmd) create(ctx context.Context, st *store.Store) int {
	tk, tok, err := st.IssueTokenRole(ctx, *t.name, store.Role(*t.role))
	if err != nil {
		fmt.Fprintln(t.stderr, "myriarchd token create:", err)
		return 1
	}
	fmt.Fprintln(t.stdout, tok)
	fmt.Fprintf(t.stderr, "Token id %d (%s, role %s). Store this token now: only its hash is kept in the database.\nRevoke it with `myriarchd token revoke %d`.\n", tk.ID, tk.Name, tk.Role, tk.ID)
	return 0
}

func (t *tokenCmd) list(ctx context.Context, st *store.Store) int {
	toks, err := st.ListTokens(ctx, *t.status)
	if err != nil {
		fmt.Fprintln(t.stderr, "myriarchd token list:", err)
		return 1
	}
	if *t.asJSON {
		if toks == nil {
			toks = []store.Token{}
		}
		printJSON(t.stdout, map[string]any{"tokens": toks})
		return 0
	}
	printTokens(t.stdout, toks)
	return 0
}

func (t *tokenCmd) revoke(ctx context.Context, st *store.Store) int {
	tk, revoked, err := st.RevokeToken(ctx, t.id, revoker())
	if errors.Is(err, store.ErrNotFound) {
		fmt.Fprintf(t.stderr, "myriarchd token revoke: no token with id %d\n", t.id)
		return 1
	}
	if err != nil {
		fmt.Fprintln(t.stderr, "myriarchd token revoke:", err)
		return 1
	}
	if !revoked {
		fmt.Fprintf(t.stdout, "token %d (%s) was already revoked at %s by %s\n", tk.ID, tk.Name, tk.RevokedAt.UTC().Format(time.RFC3339), tk.RevokedBy)
		return 0
	}
	fmt.Fprintf(t.stdout, "revoked token %d (%s); every replica refuses it from now on\n", tk.ID, tk.Name)
	return 0
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
