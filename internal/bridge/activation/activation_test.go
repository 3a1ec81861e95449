package activation

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/failover"
)

func TestMQTTDefaultBound(t *testing.T) {
	a := DefaultMQTT()
	if !a.Known || a.Transport != "mqtt" || a.Bound != 240*time.Second {
		t.Fatalf("default MQTT activation %+v, want mqtt 240s", a)
	}
	want := "2 × connect_timeout 30s + 4 × reconcile_timeout 30s + 2 × unmatched_grace 30s"
	if a.Formula != want {
		t.Fatalf("formula %q, want %q", a.Formula, want)
	}
	b, err := MQTT(time.Second, 2*time.Second, 3*time.Second)
	if err != nil || b.Bound != 2*time.Second+8*time.Second+6*time.Second {
		t.Fatalf("MQTT(1s,2s,3s) = %v, %v; want 16s", b.Bound, err)
	}
}

func TestMQTTRefusesUnboundedSteps(t *testing.T) {
	_, err := MQTT(0, -time.Second, time.Second)
	var fields []string
	for _, e := range failover.Errs(err) {
		var fe *failover.FieldError
		if !errors.As(e, &fe) {
			t.Fatalf("error %v is not a FieldError", e)
		}
		fields = append(fields, fe.Field)
	}
	if strings.Join(fields, ",") != "connect_timeout,reconcile_timeout" {
		t.Fatalf("refused fields %v, want connect_timeout and reconcile_timeout", fields)
	}
	huge := time.Duration(1 << 62)
	if _, err := MQTT(huge, time.Second, time.Second); !errors.Is(err, failover.ErrOverflow) {
		t.Fatalf("MQTT(huge) error %v, want ErrOverflow", err)
	}
}
