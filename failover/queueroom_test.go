package failover

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestQueueRoom(t *testing.T) {
	cases := []struct {
		rate    float64
		limit   int
		budget  time.Duration
		atRisk  int64
		refused bool
	}{
		{250, 1000, 6700 * time.Millisecond, 1675, true},
		{250, 2000, 6700 * time.Millisecond, 1675, false},
		{200, 1000, 5 * time.Second, 1000, false}, // exactly the limit
		{200, 1000, 5001 * time.Millisecond, 1001, true},
		{1e6, 0, time.Hour, 3_600_000_000, false}, // unlimited
		{0, 10, time.Hour, 0, false},              // nothing declared
	}
	for _, c := range cases {
		q := AssessQueueRoom(c.rate, c.limit, false, c.budget)
		if q.AtRisk != c.atRisk || (q.Err != nil) != c.refused {
			t.Errorf("rate %v limit %d budget %v: %+v, want %d at risk, refused %t", c.rate, c.limit, c.budget, q, c.atRisk, c.refused)
		}
		var fe *FieldError
		if c.refused && (!errors.As(q.Err, &fe) || fe.Field != "Limit" || !strings.Contains(fe.Rule, fmt.Sprint(c.atRisk))) {
			t.Errorf("refusal %v does not name the field and the messages at risk", q.Err)
		}
	}
	if got := MessagesAtRisk(1e300, time.Hour); got <= 0 {
		t.Errorf("overflow: %d", got)
	}
}

// The queue a source needs for a 250 msg/s stream through a failover of
// 36.667s, against a limit of 1000 messages.
func ExampleAssessQueueRoom() {
	q := AssessQueueRoom(250, 1000, false, 36667*time.Millisecond)
	fmt.Println(q)
	// Output: 9167 messages at risk (250 msg/s × 36.667s); broker queue 1000: does NOT fit
}
