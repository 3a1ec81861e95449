package lease

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric names. Every manager registered on one Registerer shares these
// collectors; per-session series carry the label "session".
const (
	MetricIsOwner         = "myriarch_lease_is_owner"
	MetricFencingVersion  = "myriarch_lease_fencing_version"
	MetricAcquireSeconds  = "myriarch_lease_acquire_duration_seconds"
	MetricRenewSeconds    = "myriarch_lease_renew_duration_seconds"
	MetricRenewFailures   = "myriarch_lease_renew_failures_total"
	MetricTransfers       = "myriarch_lease_transfers_total"
	MetricStepDowns       = "myriarch_lease_step_downs_total"
	MetricEventsDropped   = "myriarch_lease_events_dropped_total"
	MetricAcquireAttempts = "myriarch_lease_acquire_attempts_total"
)

type metrics struct {
	isOwner         *prometheus.GaugeVec
	version         *prometheus.GaugeVec
	acquireSeconds  *prometheus.HistogramVec
	renewSeconds    *prometheus.HistogramVec
	renewFailures   *prometheus.CounterVec
	transfers       *prometheus.CounterVec
	stepDowns       *prometheus.CounterVec
	eventsDropped   *prometheus.CounterVec
	acquireAttempts *prometheus.CounterVec
}

var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		isOwner: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricIsOwner,
			Help: "1 while this process owns the session's lease, else 0."}, []string{"session"}),
		version: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricFencingVersion,
			Help: "Fencing version of the lease this process holds or last held."}, []string{"session"}),
		acquireSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: MetricAcquireSeconds,
			Help: "Latency of one Acquire call (all its store operations), by outcome.", Buckets: latencyBuckets}, []string{"outcome"}),
		renewSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: MetricRenewSeconds,
			Help: "Latency of one Renew call, by outcome.", Buckets: latencyBuckets}, []string{"outcome"}),
		renewFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricRenewFailures,
			Help: "Renew calls that failed, by kind (transient or definitive)."}, []string{"session", "kind"}),
		transfers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricTransfers,
			Help: "Leases this process acquired (each is a transfer of ownership to it)."}, []string{"session"}),
		stepDowns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricStepDowns,
			Help: "Step-downs by reason: deadline, lost, renew_failures, dependency, shutdown."}, []string{"session", "reason"}),
		eventsDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricEventsDropped,
			Help: "Events dropped because the event channel was full."}, []string{"session"}),
		acquireAttempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricAcquireAttempts,
			Help: "Acquire calls by outcome (acquired, held, error)."}, []string{"outcome"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	m.isOwner = register(reg, m.isOwner, &err)
	m.version = register(reg, m.version, &err)
	m.acquireSeconds = register(reg, m.acquireSeconds, &err)
	m.renewSeconds = register(reg, m.renewSeconds, &err)
	m.renewFailures = register(reg, m.renewFailures, &err)
	m.transfers = register(reg, m.transfers, &err)
	m.stepDowns = register(reg, m.stepDowns, &err)
	m.eventsDropped = register(reg, m.eventsDropped, &err)
	m.acquireAttempts = register(reg, m.acquireAttempts, &err)
	return m, err
}

// register registers c, or returns the collector already registered under
// the same description so that many managers share one set.
func register[C prometheus.Collector](reg prometheus.Registerer, c C, errp *error) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		if *errp == nil {
			*errp = err
		}
	}
	return c
}
