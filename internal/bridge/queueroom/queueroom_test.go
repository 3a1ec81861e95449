package queueroom

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/failover"
)

func TestAssess(t *testing.T) {
	cases := []struct {
		rate    float64
		limit   int
		budget  time.Duration
		atRisk  int64
		refused bool
		assumed bool
	}{
		{250, MosquittoDefaultMaxQueued, 6700 * time.Millisecond, 1675, true, false}, // the lab's mosquitto run
		{250, 2000, 6700 * time.Millisecond, 1675, false, false},
		{200, -1, 5 * time.Second, 1000, false, true}, // exactly the assumed default
		{200, -1, 5001 * time.Millisecond, 1001, true, true},
		{1e6, 0, time.Hour, 3_600_000_000, false, false}, // unlimited
		{0, 10, time.Hour, 0, false, false},              // nothing declared
	}
	for _, c := range cases {
		q := Assess(c.rate, c.limit, c.budget)
		if q.AtRisk != c.atRisk || (q.Err != nil) != c.refused || q.LimitAssumed != c.assumed {
			t.Errorf("rate %v limit %d budget %v: %+v, want %d at risk, refused %t", c.rate, c.limit, c.budget, q, c.atRisk, c.refused)
		}
		var fe *failover.FieldError
		if c.refused && (!errors.As(q.Err, &fe) || fe.Field != "broker_max_queued_messages" || !strings.Contains(fe.Rule, fmt.Sprint(c.atRisk)) ||
			!strings.Contains(fe.Rule, "mosquitto max_queued_messages")) {
			t.Errorf("refusal %v does not name the key, the messages at risk and the broker setting", q.Err)
		}
	}
	if got := String(Assess(0, -1, time.Hour)); got != "not declared: no peak_message_rate, so the messages at risk during a failover are unknown" {
		t.Errorf("verdict %q", got)
	}
}

// The queue a broker needs for a 250 msg/s stream through the lab's
// SIGKILL failover at its budget.
func ExampleAssess() {
	fmt.Println(String(Assess(250, MosquittoDefaultMaxQueued, 36667*time.Millisecond)))
	// Output: 9167 messages at risk (250 msg/s × 36.667s); broker queue 1000: does NOT fit
}
