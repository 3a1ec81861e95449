package main

import (
	"strings"
	"testing"
)

// Bad flags of failover-lab are refused before anything starts, naming
// the flag, the value and the rule.
func TestFailoverLabRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--leader-session-timeout", "5s"}, "--leader-session-timeout 5s: must be within [10s, 10m0s]"},
		{[]string{"--runs", "0"}, "--runs 0: must be at least 1"},
		{[]string{"--scenarios", "planned-stop,nope"}, `unknown scenario "nope"`},
	} {
		var out, errb syncBuf
		if code := commands.Dispatch(append([]string{"failover-lab"}, tc.args...), &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
}
