package failover

import (
	"strings"
	"testing"
	"time"
)

// FuzzParseBrokerHealthStepDown: every input is either refused with an
// error naming the field, or round-trips to off or a positive duration.
func FuzzParseBrokerHealthStepDown(f *testing.F) {
	for _, s := range []string{"", "off", "90s", "0s", "-1m", "1h2m3.5s", "off ", "9223372036854775807ns"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := ParseBrokerHealthStepDown(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "BrokerHealthStepDown: ") {
				t.Fatalf("error does not name the field: %v", err)
			}
			return
		}
		switch {
		case !b.Declared():
			if strings.TrimSpace(s) != "" {
				t.Fatalf("%q parsed as undeclared", s)
			}
		case b.Off():
			if strings.TrimSpace(s) != "off" {
				t.Fatalf("%q parsed as off", s)
			}
		default:
			d, _ := b.After()
			if d <= 0 {
				t.Fatalf("%q parsed to non-positive %v", s, d)
			}
			if again, err := ParseBrokerHealthStepDown(d.String()); err != nil || again != b {
				t.Fatalf("%q → %v does not round-trip: %v %v", s, d, again, err)
			}
		}
		_ = time.Duration(0)
	})
}
