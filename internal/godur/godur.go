// Package godur is the one rule for durations that operators write in
// configuration files, flags and forms: a Go duration string such as 30s
// or 1m30s, surrounding white space ignored. Callers name the field and
// add their own range rules; the syntax and its message are here once.
package godur

import (
	"errors"
	"strings"
	"time"
)

// Rule is the syntax rule, as callers quote it in their errors.
const Rule = "must be a Go duration such as 30s or 1m30s"

// ErrSyntax is the error of a string that is not a Go duration.
var ErrSyntax = errors.New(Rule)

// Parse parses s, ignoring surrounding white space. A malformed s yields
// ErrSyntax (the time package's message would repeat the value that the
// caller already names).
func Parse(s string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, ErrSyntax
	}
	return d, nil
}

// Format prints d as operators write it, without zero trailing units
// (10m, 1h, not 10m0s, 1h0m0s).
func Format(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
