package disclose

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
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
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintln(stderr, "myriarch-bridge budget:", err)
		if wantsJSON(args) {
			writeJSON(stdout, BridgeBudget(p, []string{err.Error()}))
		}
		return exitRefused
	}
	r := BridgeBudget(p, inputErrs)
	f.AddQueueRoom(&r)
	if *f.JSON {
		writeJSON(stdout, r)
	} else {
		WriteBridgeTable(stdout, r)
	}
	for _, e := range r.Errors {
		fmt.Fprintln(stderr, "error:", e)
	}
	if !r.Admitted {
		return exitRefused
	}
	return exitOK
}

// RunLeaderBudget implements `myriarchd budget`.
func RunLeaderBudget(args []string, stdout, stderr io.Writer) int {
	f := NewLeaderFlags("myriarchd budget", stderr)
	r, err := f.Parse(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintln(stderr, "myriarchd budget:", err)
		if wantsJSON(args) {
			writeJSON(stdout, LeaderReport{Errors: []string{err.Error()}})
		}
		return exitRefused
	}
	if *f.JSON {
		writeJSON(stdout, r)
	} else {
		WriteLeaderTable(stdout, r)
	}
	for _, e := range r.Errors {
		fmt.Fprintln(stderr, "error:", e)
	}
	if !r.OK() {
		return exitRefused
	}
	return exitOK
}
