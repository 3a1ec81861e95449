// Package queueroom is the bridge's queue-room admission in its own words:
// the default per-session queue limits of common MQTT brokers, assumed when
// a session does not declare its broker's, and the refusal that tells the
// operator which broker setting to raise. The arithmetic is
// failover.AssessQueueRoom.
package queueroom

import (
	"fmt"
	"time"

	"github.com/myriarch/myriarch/failover"
)

// Per-session queue limits of common brokers at their defaults: the most
// QoS 1/2 messages a broker keeps for a disconnected persistent session.
// Beyond the limit each of them drops new messages silently.
const (
	// MosquittoDefaultMaxQueued is mosquitto 2.0's max_queued_messages.
	MosquittoDefaultMaxQueued = 1000
	// EMQXDefaultMaxQueued is EMQX 5's mqtt.max_mqueue_len.
	EMQXDefaultMaxQueued = 1000
	// HiveMQDefaultMaxQueued is HiveMQ's queued-messages max-queue-size.
	HiveMQDefaultMaxQueued = 1000
	// DefaultLimit is what admission assumes when a route declares a
	// peak rate and the session does not declare its broker's limit: the
	// common default above.
	DefaultLimit = 1000
)

// Keys maps failover's words of the queue room onto the bridge's keys.
var Keys = map[string]string{"PeakRate": "peak_message_rate", "Limit": "broker_max_queued_messages"}

// Assess admits a session's broker queue: rate is the peak message rate
// into the session (msg/s), limit the declared broker_max_queued_messages
// (-1 not declared: DefaultLimit is assumed; 0 unlimited), budget the
// worst-case failover budget. A refusal is a failover.FieldError on
// broker_max_queued_messages that says what to raise.
func Assess(rate float64, limit int, budget time.Duration) failover.QueueRoom {
	assumed := limit < 0
	if assumed {
		limit = DefaultLimit
	}
	q := failover.AssessQueueRoom(rate, limit, assumed, budget)
	if q.Err != nil {
		how := "declared"
		if q.LimitAssumed {
			how = "assumed: the default of mosquitto, EMQX and HiveMQ; declare the broker's real limit"
		}
		q.Err = &failover.FieldError{Field: "broker_max_queued_messages", Value: fmt.Sprint(q.Limit), Rule: fmt.Sprintf(
			"(%s) cannot hold the messages at risk: peak_message_rate %v msg/s × worst-case failover budget %v = %d messages; the broker drops the rest silently while no instance consumes the session; raise the broker's per-session queue limit to at least %d (mosquitto max_queued_messages, EMQX mqtt.max_mqueue_len, HiveMQ queued-messages max-queue-size) and declare it, or shorten the budget",
			how, q.PeakRate, q.Budget, q.AtRisk, q.AtRisk)}
	}
	return q
}

// String is the verdict line of q in the bridge's keys.
func String(q failover.QueueRoom) string {
	return failover.RenameWords(q.String(), Keys)
}
