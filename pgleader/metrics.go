package pgleader

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric names.
const (
	MetricLeader       = "myriarch_leader"
	MetricTerm         = "myriarch_leader_term"
	MetricElections    = "myriarch_leader_elections_total"
	MetricResignations = "myriarch_leader_resignations_total"
	MetricStaleEnded   = "myriarch_leader_stale_sessions_ended_total"
)

type metrics struct {
	leader       prometheus.Gauge
	term         prometheus.Gauge
	elections    prometheus.Counter
	resignations *prometheus.CounterVec
	staleEnded   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricLeader,
			Help: "1 while this replica is the leader, 0 otherwise."}),
		term: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricTerm,
			Help: "The last term (fencing epoch) this replica led in."}),
		elections: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricElections,
			Help: "Times this replica became leader."}),
		resignations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricResignations,
			Help: "Times this replica gave up leadership, by reason (confirm_timeout, session_lost, term_lost, stop)."}, []string{"reason"}),
		staleEnded: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricStaleEnded,
			Help: "Lock sessions of leaders with a heartbeat older than the leader session timeout that this replica ended."}),
	}
	for _, r := range []string{ReasonConfirmTimeout, ReasonSessionLost, ReasonTermLost, ReasonStop} {
		m.resignations.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.leader, m.term, m.elections, m.resignations, m.staleEnded} {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}
