package main

import (
	"bytes"
	"strings"
	"testing"
)

// Bad flags of `myriarch-lab anchors` are refused before anything starts,
// naming the flag, the value and the rule.
func TestAnchorsRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--reps", "0"}, "--reps 0: must be at least 1"},
		{[]string{"--systems", "myriarch-lease,zookeeper"}, `--systems: unknown value "zookeeper"`},
		{[]string{"--faults", "sigstop,reboot"}, `--faults: unknown value "reboot"`},
		{[]string{"--faults", ","}, `--faults ",": must name at least one of`},
		{[]string{"--stop", "-1s"}, "--stop -1s: must not be negative"},
		{[]string{"--pgleader-t", "5s"}, "--pgleader-t 5s: must be within [10s, 10m0s]"},
		{[]string{"--etcd-ttl", "1500ms"}, "--etcd-ttl 1.5s: must be whole seconds, at least 1s"},
	} {
		var out, errb bytes.Buffer
		if code := commands.Dispatch(append([]string{"anchors"}, tc.args...), &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
}
