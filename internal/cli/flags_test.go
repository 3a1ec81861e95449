package cli

import (
	"flag"
	"io"
	"slices"
	"testing"
)

func TestParseInterspersed(t *testing.T) {
	fs := NewFlagSet("prog sub", "usage", io.Discard)
	name := fs.String("name", "", "")
	pos, err := ParseInterspersed(fs, []string{"a", "--name", "x", "b", "c"})
	if err != nil || *name != "x" || !slices.Equal(pos, []string{"a", "b", "c"}) {
		t.Fatalf("got %q %q %v; want name x and positionals a b c", *name, pos, err)
	}
	if _, err := ParseInterspersed(NewFlagSet("p", "", io.Discard), []string{"a", "--nope"}); err == nil {
		t.Fatal("an unknown flag after a positional was accepted")
	}
}

func TestParseStatus(t *testing.T) {
	if ParseStatus(flag.ErrHelp, true) != 0 || ParseStatus(flag.ErrHelp, false) != ExitUsage || ParseStatus(io.EOF, true) != ExitUsage {
		t.Fatal("-h is success only when the command says so; every other parse error is ExitUsage")
	}
}

func TestTakeFileFlag(t *testing.T) {
	for _, c := range []struct {
		args, rest []string
		file       string
	}{
		{[]string{"-c", "a.yaml", "--json"}, []string{"--json"}, "a.yaml"},
		{[]string{"--x", "--config=b.yaml"}, []string{"--x"}, "b.yaml"},
		{[]string{"--json", "-config", "c.yaml", "--c=d.yaml"}, []string{"--json"}, "d.yaml"},
		{[]string{"c", "--cc", "x"}, []string{"c", "--cc", "x"}, ""},
	} {
		file, rest, err := TakeFileFlag(c.args, "c", "config")
		if err != nil || file != c.file || !slices.Equal(rest, c.rest) {
			t.Errorf("%q: file %q rest %q (%v); want %q %q", c.args, file, rest, err, c.file, c.rest)
		}
	}
	if _, _, err := TakeFileFlag([]string{"--json", "-c"}, "c"); err == nil {
		t.Error("-c without a file name was accepted")
	}
}
