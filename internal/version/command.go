package version

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/myriarch/myriarch/internal/cli"
)

// Command is the `version` subcommand of a program; Register also makes
// `<program> --version` run it.
func Command(program string) cli.Command {
	return cli.Command{
		Name:    "version",
		Summary: "print the version of this build (also --version)",
		Run: func(args []string, stdout, stderr io.Writer) int {
			fs := flag.NewFlagSet(program+" version", flag.ContinueOnError)
			fs.SetOutput(stderr)
			asJSON := fs.Bool("json", false, "print one JSON object: version, revision, go_version, platform")
			if err := fs.Parse(args); err != nil {
				if errors.Is(err, flag.ErrHelp) {
					return 0
				}
				return cli.ExitUsage
			}
			if fs.NArg() > 0 {
				fmt.Fprintf(stderr, "usage: %s version [--json]\n", program)
				return cli.ExitUsage
			}
			info := Get()
			if *asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				_ = enc.Encode(info)
				return 0
			}
			fmt.Fprintln(stdout, info.Line(program))
			return 0
		},
	}
}

// Register adds the version command to r under "version" and "--version".
func Register(r *cli.Registry) {
	c := Command(r.Program)
	r.Register(c)
	c.Name = "--version"
	r.Register(c)
}
