package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/fleet/config"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

func init() {
	commands.Register(cli.Command{
		Name:    "token",
		Summary: "manage API tokens: token create --name NAME",
		Run:     runToken,
	})
}

func runToken(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "create" {
		fmt.Fprintln(stderr, "Usage: myriarchd token create --name NAME [--config FILE]")
		return cli.ExitUsage
	}
	fs := flag.NewFlagSet("token create", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgFile := fs.String("config", os.Getenv("MYRIARCH_CONFIG"), "YAML configuration file (env MYRIARCH_CONFIG); only database.url is used")
	name := fs.String("name", "", "name of the token (shown in logs of the requests it makes)")
	if err := fs.Parse(args[1:]); err != nil {
		return cli.ExitUsage
	}
	if *name == "" {
		fmt.Fprintln(stderr, "myriarchd token create: --name is required")
		return cli.ExitUsage
	}
	cfg, err := config.Load(config.Source{File: *cfgFile, Optional: []string{"server.enrollmentSecret"}})
	if err != nil {
		fmt.Fprintln(stderr, "myriarchd: invalid configuration:\n", err)
		return cli.ExitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := store.Open(ctx, cfg.Database.URL, 2, nil)
	if err != nil {
		fmt.Fprintln(stderr, "myriarchd token create:", err)
		return 1
	}
	defer st.Close()
	tok, err := st.CreateToken(ctx, *name)
	if err != nil {
		fmt.Fprintln(stderr, "myriarchd token create:", err)
		return 1
	}
	fmt.Fprintln(stdout, tok)
	fmt.Fprintln(stderr, "Store this token now: only its hash is kept in the database.")
	return 0
}
