package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/myriarch/myriarch/internal/cli"
)

// fileFlags is the flag set of a command that reads the configuration
// file named by -c, with the file flag defined.
func fileFlags(prog string, stderr io.Writer) (*flag.FlagSet, *string) {
	fs := cli.NewFlagSet(prog, "", stderr)
	return fs, fs.String("c", "", "configuration file (YAML)")
}

// parseFileFlags parses args: -h is success (0); a bad flag, a missing -c
// or a positional argument is ExitUsage, the last two with usage printed.
func parseFileFlags(fs *flag.FlagSet, file *string, args []string, usage string, stderr io.Writer) (int, bool) {
	if err := fs.Parse(args); err != nil {
		return cli.ParseStatus(err, true), false
	}
	if *file == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, usage)
		return cli.ExitUsage, false
	}
	return 0, true
}
