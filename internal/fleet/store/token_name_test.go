package store

import (
	"strings"
	"testing"
)

// A token's name is shown in lists, logs and refusals: bounded, one line,
// storable (a NUL made POST /api/v1/tokens answer 500 with a SQLSTATE).
func TestCheckTokenName(t *testing.T) {
	for _, ok := range []string{"ci", "Jörg's laptop", strings.Repeat("ä", MaxTokenNameLen)} {
		if err := CheckTokenName(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for name, want := range map[string]string{
		"":                                     "must not be empty",
		"  ":                                   "must not be empty",
		"x\x00y":                               "control characters",
		"ci\nINFO fake log line":               "control characters",
		"\xff":                                 "valid UTF-8",
		strings.Repeat("a", MaxTokenNameLen+1): "at most 100 characters",
	} {
		if err := CheckTokenName(name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", name, err, want)
		}
	}
}
