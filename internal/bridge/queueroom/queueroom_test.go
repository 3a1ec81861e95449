package queueroom

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/failover"
)

// An undeclared limit is the brokers' default, said to be assumed; a
// refusal names the key, the messages at risk and the broker settings to
// raise. (The arithmetic is failover's and tested there.)
func TestAssessInTheBridgesWords(t *testing.T) {
	if q := Assess(200, -1, 5*time.Second); q.Limit != DefaultLimit || !q.LimitAssumed || q.Err != nil {
		t.Errorf("undeclared limit at exactly the default: %+v", q)
	}
	for limit, how := range map[int]string{-1: "(assumed: the default of mosquitto, EMQX and HiveMQ", 1500: "(declared)"} {
		q := Assess(250, limit, 6700*time.Millisecond)
		var fe *failover.FieldError
		if !errors.As(q.Err, &fe) || fe.Field != "broker_max_queued_messages" || !strings.HasPrefix(fe.Rule, how) ||
			!strings.Contains(fe.Rule, "peak_message_rate 250 msg/s × worst-case failover budget 6.7s = 1675 messages") ||
			!strings.Contains(fe.Rule, "mosquitto max_queued_messages, EMQX mqtt.max_mqueue_len, HiveMQ queued-messages max-queue-size") {
			t.Errorf("limit %d: refusal %v", limit, q.Err)
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
