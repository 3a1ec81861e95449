// Package metrics holds the bridge's Prometheus metrics. Every metric is
// prefixed myriarch_bridge_; the lease manager registers its own lease
// metrics on the same registry.
package metrics

import "github.com/prometheus/client_golang/prometheus"

// FailureToFullBuckets are the buckets of the failure-to-full histogram,
// in seconds. They reach beyond the largest budget the shipped profiles
// admit (the standalone owner-death budget, 1097.5s), so that an alert
// against any admitted failover_slo can tell a breach from the +Inf bucket.
var FailureToFullBuckets = []float64{1, 2.5, 5, 10, 15, 30, 45, 60, 90, 120, 180, 240, 300, 360, 450, 600, 900, 1200, 1800, 3600}

// Bridge is the set of bridge metrics.
type Bridge struct {
	In             *prometheus.CounterVec   // route
	Out            *prometheus.CounterVec   // route, sender
	Failed         *prometheus.CounterVec   // route, sender: failed delivery attempts
	DeadLettered   *prometheus.CounterVec   // route, sender
	Unroutable     *prometheus.CounterVec   // session
	LoopDropped    *prometheus.CounterVec   // route: messages its loop peer published
	InFlight       *prometheus.GaugeVec     // route
	ServiceLevel   *prometheus.GaugeVec     // session: 0 none, 1 degraded, 2 full
	Owner          *prometheus.GaugeVec     // session: 1 serving as lease owner, 0 standby
	TakeoverToFull *prometheus.HistogramVec // session
	FailureToFull  *prometheus.HistogramVec // session
	StepDowns      *prometheus.CounterVec   // session
	BrokerPathDown *prometheus.GaugeVec     // session: 1 while the broker path is lost
	SpoolMessages  *prometheus.GaugeVec     // route: messages in the durable spool
	SpoolBytes     *prometheus.GaugeVec     // route: bytes of those messages' records
	SpoolOldestAge *prometheus.GaugeVec     // route: age of the oldest undelivered message
}

// New creates the metrics and registers them on reg (nil: not registered).
func New(reg prometheus.Registerer) *Bridge {
	b := &Bridge{
		In: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "myriarch_bridge_messages_in_total",
			Help: "Messages received from the broker for a route."}, []string{"route"}),
		Out: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "myriarch_bridge_messages_out_total",
			Help: "Messages a sender accepted."}, []string{"route", "sender"}),
		Failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "myriarch_bridge_messages_failed_total",
			Help: "Failed delivery attempts (each is retried with backoff or dead-lettered)."}, []string{"route", "sender"}),
		DeadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "myriarch_bridge_messages_dead_lettered_total",
			Help: "Messages written to the dead-letter file after the sender's retries ran out."}, []string{"route", "sender"}),
		Unroutable: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "myriarch_bridge_messages_unroutable_total",
			Help: "Messages that matched no route's receiver (acknowledged and dropped)."}, []string{"session"}),
		LoopDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "myriarch_bridge_messages_loop_dropped_total",
			Help: "Messages a route did not take because its loop peer route had published them (loop_peer)."}, []string{"route"}),
		InFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "myriarch_bridge_messages_in_flight",
			Help: "Messages received and not yet accepted by every sender of the route."}, []string{"route"}),
		ServiceLevel: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "myriarch_bridge_service_level",
			Help: "Service level of a session: 0 none, 1 degraded, 2 full."}, []string{"session"}),
		Owner: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "myriarch_bridge_session_serving",
			Help: "1 while this instance serves the session (lease owner, or a non-exclusive session), 0 on standby."}, []string{"session"}),
		TakeoverToFull: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "myriarch_bridge_failover_takeover_to_full_seconds",
			Help:    "From winning the lease to ServiceLevelFull (the transport activation part of the failover budget).",
			Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 240}}, []string{"session"}),
		FailureToFull: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "myriarch_bridge_failover_failure_to_full_seconds",
			Help: "Failover as the failover budgets count it, recorded by the successor: from the last renewal of the previous owner " +
				"that the successor observed (the start of its last poll before that renewal) to the successor's ServiceLevelFull, " +
				"on the successor's one monotonic clock. The failure came after that renewal, so this is an upper bound of the " +
				"true failure-to-full. Not recorded when the successor observed no renewal of a previous owner.",
			Buckets: FailureToFullBuckets}, []string{"session"}),
		StepDowns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "myriarch_bridge_broker_health_step_down_total",
			Help: "Broker-path step-downs: the owner released the lease because its broker path stayed lost for broker_health_step_down."}, []string{"session"}),
		BrokerPathDown: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "myriarch_bridge_broker_path_lost",
			Help: "1 while the owner's broker path is lost, or not yet converged since it won the lease (the broker_health_step_down clock runs)."}, []string{"session"}),
		SpoolMessages: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "myriarch_bridge_spool_messages",
			Help: "Messages the route's durable spool holds: acknowledged to the source, not yet accepted by every sender nor dead-lettered."}, []string{"route"}),
		SpoolBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "myriarch_bridge_spool_bytes",
			Help: "Bytes of the records the route's durable spool holds."}, []string{"route"}),
		SpoolOldestAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "myriarch_bridge_spool_oldest_age_seconds",
			Help: "Age (since the bridge received it) of the oldest message in the route's durable spool; 0 when empty."}, []string{"route"}),
	}
	if reg != nil {
		reg.MustRegister(b.In, b.Out, b.Failed, b.DeadLettered, b.Unroutable, b.LoopDropped, b.InFlight, b.ServiceLevel, b.Owner, b.TakeoverToFull,
			b.FailureToFull, b.StepDowns, b.BrokerPathDown, b.SpoolMessages, b.SpoolBytes, b.SpoolOldestAge)
	}
	return b
}
