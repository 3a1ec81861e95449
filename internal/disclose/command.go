// Package disclose holds what the budget commands of the two daemons
// share and nothing of either daemon: the exit statuses, the JSON and
// flag-error conventions, the one duration rule of the flags, and how
// durations are written. Each daemon's report and command live with the
// daemon (internal/bridge/budget, internal/fleet/budget), so that neither
// binary links the other's settings; the docs generator calls both.
package disclose

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/myriarch/myriarch/internal/godur"
)

// Exit statuses of the budget commands.
const (
	ExitOK      = 0
	ExitRefused = 2
)

// Secs is d in seconds, for the reports' *_s fields.
func Secs(d time.Duration) *float64 {
	v := d.Seconds()
	return &v
}

// Seconds formats d as seconds with no trailing zeros, e.g. "1097.5s".
func Seconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
}

// WriteJSON prints v as indented JSON.
func WriteJSON(w io.Writer, v any) {
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

// FlagError ends a command whose flags the flag package refused: -h is no
// error; otherwise the error goes to stderr and, when --json was asked
// for, obj (a report carrying the error) to stdout.
func FlagError(name string, args []string, err error, obj any, stdout, stderr io.Writer) int {
	if errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	fmt.Fprintln(stderr, name+":", err)
	if wantsJSON(args) {
		WriteJSON(stdout, obj)
	}
	return ExitRefused
}

// Report prints a report as JSON or as its table, its errors to stderr,
// and returns the exit status.
func Report(asJSON bool, obj any, table func(), errs []string, ok bool, stdout, stderr io.Writer) int {
	if asJSON {
		WriteJSON(stdout, obj)
	} else {
		table()
	}
	for _, e := range errs {
		fmt.Fprintln(stderr, "error:", e)
	}
	if !ok {
		return ExitRefused
	}
	return ExitOK
}

// ParseDur is the one duration rule of both budget commands; errors name
// the flag, the setting it stands for, the value and the rule.
func ParseDur(flagName, field, s string, allowZero bool) (time.Duration, error) {
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

// DurFlag is a duration flag whose default is a value (not a string to
// parse again) and whose bad input is reported by Parse with the other
// flags' errors instead of stopping the flag package at the first.
type DurFlag struct {
	Flag, Field string
	AllowZero   bool
	D           time.Duration
	raw         *string
}

func (v *DurFlag) String() string {
	if v == nil {
		return ""
	}
	return v.D.String()
}

// Set records the value given on the command line; Parse converts it.
func (v *DurFlag) Set(s string) error { v.raw = &s; return nil }

// Parse converts a value given on the command line; without one the
// starting value stands.
func (v *DurFlag) Parse() error {
	if v.raw == nil {
		return nil
	}
	d, err := ParseDur(v.Flag, v.Field, *v.raw, v.AllowZero)
	if err != nil {
		return err
	}
	v.D = d
	return nil
}
