// Package budgetcmd is the command-line front end of the two daemons'
// budget commands: their flags, exit statuses and output. The reports
// themselves (data and tables) are package disclose, which the daemons
// and the docs generator call with values.
package budgetcmd

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/leasemode"
	"github.com/myriarch/myriarch/internal/disclose"
	"github.com/myriarch/myriarch/internal/godur"
)

// Exit statuses of the budget commands.
const (
	exitOK      = 0
	exitRefused = 2
)

func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// wantsJSON finds --json in args that the flag package could not parse, so
// that a bad flag still yields the JSON object a caller asked for.
func wantsJSON(args []string) bool {
	for _, a := range args {
		if a == "--" {
			break
		}
		switch strings.TrimLeft(a, "-") {
		case "json", "json=true", "json=1":
			return strings.HasPrefix(a, "-")
		}
	}
	return false
}

// RunBridgeBudget implements `myriarch-bridge budget`. With --json the
// object is printed to stdout whatever the outcome; errors also go to
// stderr; the status is 2 for invalid input or a refused objective.
func RunBridgeBudget(args []string, stdout, stderr io.Writer) int {
	f := NewBridgeFlags("myriarch-bridge budget", stderr)
	p, inputErrs, err := f.Parse(args)
	mode, _ := leasemode.Parse(*f.mode) // refused by Parse
	if err != nil {
		return flagError("myriarch-bridge budget", args, err, disclose.BridgeBudget(mode, p, []string{err.Error()}), stdout, stderr)
	}
	r := disclose.BridgeBudget(mode, p, inputErrs)
	f.AddQueueRoom(&r)
	return report(*f.JSON, r, func() { disclose.WriteBridgeTable(stdout, r) }, r.Errors, r.Admitted, stdout, stderr)
}

// RunLeaderBudget implements `myriarchd budget`, starting from in (the
// loaded configuration); flags given explicitly override it.
func RunLeaderBudget(args []string, in LeaderInputs, stdout, stderr io.Writer) int {
	f := NewLeaderFlags("myriarchd budget", in, stderr)
	r, err := f.Parse(args)
	if err != nil {
		return flagError("myriarchd budget", args, err, disclose.LeaderReport{Errors: []string{err.Error()}}, stdout, stderr)
	}
	return report(*f.JSON, r, func() { disclose.WriteLeaderTable(stdout, r) }, r.Errors, r.OK(), stdout, stderr)
}

// flagError ends a command whose flags the flag package refused: -h is no
// error; otherwise the error goes to stderr and, when --json was asked
// for, obj (a report carrying the error) to stdout.
func flagError(name string, args []string, err error, obj any, stdout, stderr io.Writer) int {
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	fmt.Fprintln(stderr, name+":", err)
	if wantsJSON(args) {
		writeJSON(stdout, obj)
	}
	return exitRefused
}

// report prints a report as JSON or as its table, its errors to stderr,
// and returns the exit status.
func report(asJSON bool, obj any, table func(), errs []string, ok bool, stdout, stderr io.Writer) int {
	if asJSON {
		writeJSON(stdout, obj)
	} else {
		table()
	}
	for _, e := range errs {
		fmt.Fprintln(stderr, "error:", e)
	}
	if !ok {
		return exitRefused
	}
	return exitOK
}

// parseDur is the one duration rule of both budget commands; errors name
// the flag, the setting it stands for, the value and the rule.
func parseDur(flagName, field, s string, allowZero bool) (time.Duration, error) {
	d, err := godur.Parse(s)
	switch {
	case err != nil:
		return 0, fmt.Errorf("--%s (%s): %q: %w", flagName, field, s, err)
	case d < 0:
		return d, fmt.Errorf("--%s (%s): %q: must not be negative", flagName, field, s)
	case d == 0 && !allowZero:
		return d, fmt.Errorf("--%s (%s): %q: must be positive", flagName, field, s)
	}
	return d, nil
}

// durFlag is a duration flag whose default is a value (not a string to
// parse again) and whose bad input is reported by parse with the other
// flags' errors instead of stopping the flag package at the first.
type durFlag struct {
	flag, field string
	allowZero   bool
	d           time.Duration
	raw         *string
}

func (v *durFlag) String() string {
	if v == nil {
		return ""
	}
	return v.d.String()
}

func (v *durFlag) Set(s string) error { v.raw = &s; return nil }

// parse converts a value given on the command line; without one the
// starting value stands.
func (v *durFlag) parse() error {
	if v.raw == nil {
		return nil
	}
	d, err := parseDur(v.flag, v.field, *v.raw, v.allowZero)
	if err != nil {
		return err
	}
	v.d = d
	return nil
}
