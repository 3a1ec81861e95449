package cli

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

func TestDispatch(t *testing.T) {
	var got []string
	r := &Registry{Program: "prog", Default: "run"}
	for _, name := range []string{"run", "budget"} {
		r.Register(Command{Name: name, Summary: name + " things", Run: func(args []string, _, _ io.Writer) int {
			got = append(got, name+":"+strings.Join(args, ","))
			return 7
		}})
	}
	var out, errOut bytes.Buffer
	for _, tc := range []struct {
		args []string
		code int
		call string
	}{
		{[]string{"budget", "--json"}, 7, "budget:--json"},
		{[]string{"--dev"}, 7, "run:--dev"},
		{nil, 7, "run:"},
		{[]string{"nope"}, ExitUsage, ""},
		{[]string{"help"}, 0, ""},
	} {
		got = nil
		if code := r.Dispatch(tc.args, &out, &errOut); code != tc.code {
			t.Errorf("%v: exit %d, want %d", tc.args, code, tc.code)
		}
		if tc.call != "" && (len(got) != 1 || got[0] != tc.call) {
			t.Errorf("%v: calls %v, want %s", tc.args, got, tc.call)
		}
		if tc.call == "" && len(got) != 0 {
			t.Errorf("%v: unexpected calls %v", tc.args, got)
		}
	}
	if !strings.Contains(errOut.String(), `unknown command "nope"`) || !strings.Contains(out.String(), "budget things") {
		t.Fatalf("usage output: %q / %q", out.String(), errOut.String())
	}
	defer func() {
		if recover() == nil {
			t.Fatal("duplicate command registered without panic")
		}
	}()
	r.Register(Command{Name: "run"})
}
