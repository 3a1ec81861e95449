package main

import (
	"strings"
	"testing"
)

// An API command warns on stderr when its token crosses the network in
// clear text (http:// to another machine), and stays quiet for loopback.
func TestPlainHTTPWarning(t *testing.T) {
	run := func(server string) string {
		var out, errb syncBuf
		commands.Dispatch([]string{"overview", "--server", server, "--token", "myr_x", "-o", "json"}, &out, &errb)
		if strings.Contains(out.String(), "warning") {
			t.Errorf("%s: the warning went to stdout: %q", server, out.String())
		}
		return errb.String()
	}
	const warn = "warning: the API token goes in clear text over http:// to http://lab.invalid:1 (not this machine)"
	if e := run("http://lab.invalid:1"); !strings.Contains(e, warn) {
		t.Errorf("no warning for a remote http:// server: %q", e)
	}
	if e := run("http://127.0.0.1:1"); strings.Contains(e, "warning") {
		t.Errorf("warning for loopback: %q", e)
	}
}
