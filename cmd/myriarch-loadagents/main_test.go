package main

import (
	"bytes"
	"strings"
	"testing"
)

// The load tool runs on the shared dispatcher: its commands are listed,
// bad flags and unknown commands exit with 2, a failure with 1.
func TestDispatch(t *testing.T) {
	var out, errb bytes.Buffer
	if code := commands.Dispatch([]string{"help"}, &out, &errb); code != 0 {
		t.Fatalf("help: %d", code)
	}
	for _, c := range []string{"agents", "proxy", "wait"} {
		if !strings.Contains(out.String(), c) {
			t.Errorf("help lacks %q: %s", c, out.String())
		}
	}
	if code := commands.Dispatch([]string{"wait", "--no-such-flag"}, &out, &errb); code != 2 {
		t.Errorf("bad flag: exit %d", code)
	}
	if code := commands.Dispatch([]string{"launch"}, &out, &errb); code != 2 {
		t.Errorf("unknown command: exit %d", code)
	}
	errb.Reset()
	if code := commands.Dispatch([]string{"proxy", "--listen", "127.0.0.1:0"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "--backends is required") {
		t.Errorf("proxy without backends: exit %d, %q", code, errb.String())
	}
}
