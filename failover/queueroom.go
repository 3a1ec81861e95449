package failover

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// QueueRoom is the admission of a session's queue at its source (the
// bridge: the MQTT broker's per-session queue). From the owner's failure to
// the successor's full service nobody consumes the session, and the source
// queues its messages; a queue limit below PeakRate × Budget drops the
// excess, whatever the budget promises.
type QueueRoom struct {
	// PeakRate is the declared peak message rate into the session, in
	// messages per second.
	PeakRate float64
	// Limit is the queue limit; 0 means unlimited.
	Limit int
	// LimitAssumed is true when Limit was not declared but assumed by
	// the caller (a common default of the source).
	LimitAssumed bool
	// Budget is the worst-case failover budget of the session: the
	// larger of the owner-death and broker-path budgets.
	Budget time.Duration
	// AtRisk is MessagesAtRisk(PeakRate, Budget).
	AtRisk int64
	// Err is non-nil when the queue cannot hold AtRisk messages: a
	// FieldError on Limit.
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
// cannot hold them. limit 0 means unlimited; assumed says that the caller
// assumed limit because none was declared. A rate of 0 declares nothing
// and admits.
func AssessQueueRoom(rate float64, limit int, assumed bool, budget time.Duration) QueueRoom {
	q := QueueRoom{PeakRate: rate, Limit: limit, LimitAssumed: assumed, Budget: budget}
	q.AtRisk = MessagesAtRisk(rate, budget)
	if q.Limit > 0 && q.AtRisk > int64(q.Limit) {
		q.Err = fieldErr("Limit", q.Limit, "cannot hold the messages at risk: PeakRate %v msg/s × Budget %v = %d messages", rate, budget, q.AtRisk)
	}
	return q
}

// String states the verdict in one line.
func (q QueueRoom) String() string {
	if q.PeakRate <= 0 {
		return "not declared: no PeakRate, so the messages at risk during a failover are unknown"
	}
	limit := strconv.Itoa(q.Limit)
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
