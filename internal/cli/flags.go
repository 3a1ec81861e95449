package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// NewFlagSet returns the flag set of the subcommand prog: it reports to
// stderr and, when usage is not empty, prints usage for -h and after a
// flag that it does not know (otherwise the flag package lists the flags).
func NewFlagSet(prog, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	fs.SetOutput(stderr)
	if usage != "" {
		fs.Usage = func() { fmt.Fprintln(stderr, usage) }
	}
	return fs
}

// ParseInterspersed parses args with flags before, between and after the
// positional arguments, which it returns in order.
func ParseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
}

// ParseStatus is the exit status of a command whose flags did not parse:
// 0 for -h when helpIsSuccess, else ExitUsage.
func ParseStatus(err error, helpIsSuccess bool) int {
	if helpIsSuccess && errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return ExitUsage
}

// TakeFileFlag removes the flag -name FILE (or -name=FILE, with one or two
// dashes, under any of names) from args, for commands that hand the rest
// of their arguments to another parser. The last one given wins.
func TakeFileFlag(args []string, names ...string) (file string, rest []string, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || !slices.Contains(names, name) {
			rest = append(rest, a)
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return "", nil, fmt.Errorf("flag %s needs a file name", a)
			}
			i++
			val = args[i]
		}
		file = val
	}
	return file, rest, nil
}
