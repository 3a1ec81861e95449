package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/fleet/apiclient"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

func init() {
	apiCommands = append(apiCommands,
		apiCmd{group: "token", name: "create", summary: "create an API token; prints it once (admin; POST /api/v1/tokens)",
			flags: map[string]string{"name": "name of the token (in the logs of the requests it makes)", "role": "viewer, operator or admin"},
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				if x.str("name") == "" {
					x.bad = append(x.bad, "--name is required")
				}
				role, err := store.ParseRole(x.str("role"))
				if err != nil {
					x.bad = append(x.bad, "--role: "+err.Error()+" (a token's power is chosen, not defaulted)")
				}
				if err := x.refused(); err != nil {
					return nil, nil, err
				}
				t, err := c.CreateToken(ctx, x.str("name"), role)
				return t, func(w io.Writer) {
					fmt.Fprintln(w, t.Secret)
					fmt.Fprintf(x.stderr, "Token id %d (%s, role %s). Store this token now: only its hash is kept.\nRevoke it with `myriarchd token revoke %d`.\n", t.Token.ID, t.Token.Name, t.Token.Role, t.Token.ID)
				}, err
			}},
		apiCmd{group: "token", name: "list", summary: "API tokens, never their secrets (admin; GET /api/v1/tokens)",
			flags: map[string]string{"status": "active or revoked: only those"},
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				l, err := c.Tokens(ctx, x.str("status"))
				return l, func(w io.Writer) { printTokens(w, l.Tokens) }, err
			}},
		apiCmd{group: "token", name: "revoke", args: []string{"ID"}, summary: "revoke a token; every replica refuses it at once (admin; DELETE /api/v1/tokens/{id})",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				id := x.id(0, "token list")
				if err := x.refused(); err != nil {
					return nil, nil, err
				}
				r, err := c.RevokeToken(ctx, id)
				return r, func(w io.Writer) {
					if !r.Revoked {
						fmt.Fprintf(w, "token %d (%s) was already revoked at %s by %s\n", r.Token.ID, r.Token.Name, ts(r.Token.RevokedAt), r.Token.RevokedBy)
						return
					}
					fmt.Fprintf(w, "revoked token %d (%s); every replica refuses it from now on\n", r.Token.ID, r.Token.Name)
				}, err
			}},
	)
	registerGroup("token", "API tokens: token create --name N --role R | list | revoke ID (through the API); token bootstrap (the first admin token, in the database)",
		"", map[string]func([]string, io.Writer, io.Writer) int{"bootstrap": runTokenBootstrap},
		"  myriarchd token bootstrap --name NAME [--config FILE] [--force]\n"+
			"      the first admin token, written to the database (database.url of the\n"+
			"      daemon's configuration); refused while an active admin token exists,\n"+
			"      unless --force (a lost admin token).")
	commands.Register(cli.Command{Name: "migrate", Summary: "apply the database migrations and exit (--config FILE: the daemon's configuration)", Run: runMigrate})
}

// runTokenBootstrap writes the first admin token to the database: the one
// command besides serve and migrate that opens it, for the operator who
// has no token to call the API with yet.
func runTokenBootstrap(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("myriarchd token bootstrap", "", stderr)
	cfgFile := fs.String("config", os.Getenv("MYRIARCH_CONFIG"), "the daemon's YAML configuration file (env MYRIARCH_CONFIG); only database.url is used")
	name := fs.String("name", "", "name of the token")
	force := fs.Bool("force", false, "create it although an active admin token exists")
	pos, err := cli.ParseInterspersed(fs, args)
	if err != nil {
		return cli.ParseStatus(err, true)
	}
	prog := "myriarchd token bootstrap"
	if len(pos) > 0 {
		fmt.Fprintf(stderr, "%s: unexpected arguments %q\n", prog, pos)
		return cli.ExitUsage
	}
	if *name == "" {
		fmt.Fprintf(stderr, "%s: --name is required\n", prog)
		return cli.ExitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, code := openDB(ctx, prog, *cfgFile, stderr)
	if st == nil {
		return code
	}
	defer st.Close()
	toks, err := st.ListTokens(ctx, store.TokensActive)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return 1
	}
	for _, t := range toks {
		if t.Role == store.RoleAdmin && !*force {
			fmt.Fprintf(stderr, "%s: an active admin token exists (id %d, %s): create more with `myriarchd token create` through the API, or pass --force if it is lost\n", prog, t.ID, t.Name)
			return 1
		}
	}
	tk, tok, err := st.IssueTokenRole(ctx, *name, store.RoleAdmin)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return 1
	}
	fmt.Fprintln(stdout, tok)
	fmt.Fprintf(stderr, "Admin token id %d (%s). Store this token now: only its hash is kept in the database.\n"+
		"Save it in a context: myriarchd context set NAME --server URL --token <token>\n", tk.ID, tk.Name)
	return 0
}

// runMigrate applies the migrations (serve does too, at start) and exits:
// for an upgrade run before the replicas start.
func runMigrate(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("myriarchd migrate", "", stderr)
	cfgFile := fs.String("config", os.Getenv("MYRIARCH_CONFIG"), "the daemon's YAML configuration file (env MYRIARCH_CONFIG); only database.url is used")
	if err := fs.Parse(args); err != nil {
		return cli.ParseStatus(err, true)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "myriarchd migrate: unexpected arguments %q\n", fs.Args())
		return cli.ExitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	st, code := openDB(ctx, "myriarchd migrate", *cfgFile, stderr)
	if st == nil {
		return code
	}
	st.Close()
	fmt.Fprintln(stdout, "the database schema is up to date")
	return 0
}

func printTokens(w io.Writer, toks []store.Token) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tROLE\tCREATED\tLAST USED\tSTATUS")
	for _, t := range toks {
		status := "active"
		if t.RevokedAt != nil {
			status = "revoked " + ts(t.RevokedAt) + " by " + t.RevokedBy
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Name, t.Role, ts(&t.CreatedAt), ts(t.LastUsedAt), status)
	}
	_ = tw.Flush()
}
