package failover

import (
	"fmt"
	"math"
	"time"
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
	// DefaultBrokerQueueLimit is what admission assumes when a route
	// declares a peak rate and the session does not declare its broker's
	// limit: the common default above.
	DefaultBrokerQueueLimit = 1000
)

// QueueRoom is the admission of a session's broker-side queue. From the
// owner's failure to the successor's full service nobody consumes the
// session, and the broker queues its messages; a queue limit below
// PeakRate × Budget drops the excess, whatever the budget promises.
type QueueRoom struct {
	// PeakRate is the declared peak message rate into the session, in
	// messages per second (the sum of its routes' peak_message_rate).
	PeakRate float64
	// Limit is the broker's per-session queue limit; 0 means unlimited.
	Limit int
	// LimitAssumed is true when the session did not declare Limit and
	// DefaultBrokerQueueLimit was assumed.
	LimitAssumed bool
	// Budget is the worst-case failover budget of the session: the
	// larger of the owner-death and broker-path budgets.
	Budget time.Duration
	// AtRisk is MessagesAtRisk(PeakRate, Budget).
	AtRisk int64
	// Err is non-nil when the queue cannot hold AtRisk messages.
	Err error
}

// MessagesAtRisk is the number of messages a broker must queue for a
// session that nobody consumes for budget at rate messages per second:
// ceil(rate × budget in seconds).
func MessagesAtRisk(rate float64, budget time.Duration) int64 {
	if rate <= 0 || budget <= 0 {
		return 0
	}
	v := math.Ceil(rate * budget.Seconds())
	if v >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(v)
}

// AssessQueueRoom computes the messages at risk and refuses a limit that
// cannot hold them. limit < 0 means not declared (DefaultBrokerQueueLimit
// is assumed); 0 means unlimited. A rate of 0 declares nothing and admits.
func AssessQueueRoom(rate float64, limit int, budget time.Duration) QueueRoom {
	q := QueueRoom{PeakRate: rate, Limit: limit, Budget: budget}
	if limit < 0 {
		q.Limit, q.LimitAssumed = DefaultBrokerQueueLimit, true
	}
	q.AtRisk = MessagesAtRisk(rate, budget)
	if q.Limit > 0 && q.AtRisk > int64(q.Limit) {
		how := "declared"
		if q.LimitAssumed {
			how = "assumed: the default of mosquitto, EMQX and HiveMQ; declare the broker's real limit"
		}
		q.Err = fieldErr("broker_max_queued_messages", q.Limit,
			"(%s) cannot hold the messages at risk: peak_message_rate %v msg/s × worst-case failover budget %v = %d messages; the broker drops the rest silently while no instance consumes the session; raise the broker's per-session queue limit to at least %d (mosquitto max_queued_messages, EMQX mqtt.max_mqueue_len, HiveMQ queued-messages max-queue-size) and declare it, or shorten the budget",
			how, rate, budget, q.AtRisk, q.AtRisk)
	}
	return q
}

// String states the verdict in one line.
func (q QueueRoom) String() string {
	if q.PeakRate <= 0 {
		return "not declared: no peak_message_rate, so the messages at risk during a failover are unknown"
	}
	limit := fmt.Sprint(q.Limit)
	switch {
	case q.Limit == 0:
		limit = "unlimited"
	case q.LimitAssumed:
		limit += " (assumed)"
	}
	verdict := "fits"
	if q.Err != nil {
		verdict = "does NOT fit"
	}
	return fmt.Sprintf("%d messages at risk (%v msg/s × %v); broker queue %s: %s", q.AtRisk, q.PeakRate, q.Budget, limit, verdict)
}
