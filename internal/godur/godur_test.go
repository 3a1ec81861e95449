package godur

import (
	"errors"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]time.Duration{"30s": 30 * time.Second, " 1m30s\n": 90 * time.Second, "-2s": -2 * time.Second, "0": 0} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "30", "abc", "1e3s", "2562048h"} {
		if _, err := Parse(in); !errors.Is(err, ErrSyntax) {
			t.Errorf("Parse(%q) error %v, want ErrSyntax", in, err)
		}
	}
}
