// Package cli is the small subcommand dispatcher of Myriarch's two daemons.
//
// The standard flag package parses each subcommand's flags: the daemons
// have a handful of subcommands, so a framework would add dependencies and
// surface without adding behaviour. Each subcommand lives in its own file
// and registers itself from init, so adding one never touches main.
package cli

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// ExitUsage is the exit status for invalid input and refused configurations.
const ExitUsage = 2

// Command is one subcommand.
type Command struct {
	Name    string
	Summary string
	// Run executes the command with the arguments after its name and
	// returns the process exit status.
	Run func(args []string, stdout, stderr io.Writer) int
}

// Registry holds the subcommands of one program.
type Registry struct {
	Program string
	// Default runs when the first argument names no command; "" prints usage.
	Default  string
	commands map[string]Command
}

// Register adds a command; a duplicate name is a programming error.
func (r *Registry) Register(c Command) {
	if r.commands == nil {
		r.commands = map[string]Command{}
	}
	if _, dup := r.commands[c.Name]; dup {
		panic("cli: duplicate command " + c.Name)
	}
	r.commands[c.Name] = c
}

// Names lists the registered commands, sorted.
func (r *Registry) Names() []string {
	names := make([]string, 0, len(r.commands))
	for n := range r.commands {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Main dispatches os.Args and exits with the command's status.
func (r *Registry) Main() {
	os.Exit(r.Dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

// Dispatch runs the command named by args[0].
func (r *Registry) Dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if c, ok := r.commands[args[0]]; ok {
			return c.Run(args[1:], stdout, stderr)
		}
		if args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
			r.usage(stdout)
			return 0
		}
	}
	if c, ok := r.commands[r.Default]; ok && (len(args) == 0 || strings.HasPrefix(args[0], "-")) {
		return c.Run(args, stdout, stderr)
	}
	if len(args) > 0 {
		fmt.Fprintf(stderr, "%s: unknown command %q\n", r.Program, args[0])
	}
	r.usage(stderr)
	return ExitUsage
}

func (r *Registry) usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: %s <command> [flags]\n\nCommands:\n", r.Program)
	names := make([]string, 0, len(r.commands))
	for n := range r.commands {
		if !strings.HasPrefix(n, "-") { // flag-style aliases such as --version
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-14s %s\n", n, r.commands[n].Summary)
	}
	fmt.Fprintf(w, "\nRun '%s <command> -h' for the flags of a command.\n", r.Program)
}

// Moved is a command that has moved elsewhere: it prints message (where it
// went) and returns ExitUsage.
func Moved(name, summary, message string) Command {
	return Command{Name: name, Summary: summary, Run: func(_ []string, _, stderr io.Writer) int {
		fmt.Fprintln(stderr, message)
		return ExitUsage
	}}
}
