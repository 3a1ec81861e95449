package main

import (
	"bytes"
	"strings"
	"testing"
)

// Bad flags of `myriarch-lab leader` are refused before anything starts, naming
// the flag, the value and the rule.
func TestLeaderLabRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--leader-session-timeout", "5s"}, "--leader-session-timeout 5s: must be within [10s, 10m0s]"},
		{[]string{"--runs", "0"}, "--runs 0: must be at least 1"},
		{[]string{"--scenarios", "planned-stop,nope"}, `unknown scenario "nope"`},
	} {
		var out, errb bytes.Buffer
		if code := commands.Dispatch(append([]string{"leader"}, tc.args...), &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
}
