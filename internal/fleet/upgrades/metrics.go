package upgrades

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports the package rollout metrics from the database, the
// same on every replica: myriarch_package_rollouts_active and, per active
// rollout, myriarch_package_rollout_paused, myriarch_package_rollout_wave
// and myriarch_package_rollout_agents{state}.
type Collector struct {
	Pool *pgxpool.Pool
}

var (
	descActive = prometheus.NewDesc("myriarch_package_rollouts_active", "Package rollouts that are pending, running, paused or rolling back.", nil, nil)
	descPaused = prometheus.NewDesc("myriarch_package_rollout_paused", "1 while the package rollout is paused.", []string{"rollout", "package"}, nil)
	descWave   = prometheus.NewDesc("myriarch_package_rollout_wave", "Current wave of the package rollout (1-based; 0 before it is planned).", []string{"rollout", "package"}, nil)
	descAgents = prometheus.NewDesc("myriarch_package_rollout_agents", "Agents of the package rollout by state.", []string{"rollout", "package", "state"}, nil)
)

// AgentStates lists the agent states in display order.
var AgentStates = []string{AgentPending, AgentInProgress, AgentInstalled, AgentFailed, AgentSkipped, AgentReverted}

// Describe implements prometheus.Collector.
func (c Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descActive, descPaused, descWave, descAgents} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	rows, err := c.Pool.Query(ctx, `SELECT r.id, r.package, r.state, r.wave, r.waves,
			coalesce((SELECT jsonb_object_agg(state, n) FROM (SELECT state, count(*) AS n FROM package_rollout_agents ra
				WHERE ra.rollout_id = r.id GROUP BY state) x), '{}')
		FROM package_rollouts r WHERE r.state IN ('pending', 'running', 'paused', 'rolling_back') ORDER BY r.id`)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descActive, err)
		return
	}
	var id int64
	var pkg, state string
	var wave, waves int
	var counts map[string]int
	n := 0
	_, err = pgx.ForEachRow(rows, []any{&id, &pkg, &state, &wave, &waves, &counts}, func() error {
		n++
		l := fmt.Sprint(id)
		paused := 0.0
		if state == StatePaused {
			paused = 1
		}
		w := 0
		if waves > 0 {
			w = wave + 1
		}
		ch <- prometheus.MustNewConstMetric(descPaused, prometheus.GaugeValue, paused, l, pkg)
		ch <- prometheus.MustNewConstMetric(descWave, prometheus.GaugeValue, float64(w), l, pkg)
		for _, st := range AgentStates {
			ch <- prometheus.MustNewConstMetric(descAgents, prometheus.GaugeValue, float64(counts[st]), l, pkg, st)
		}
		return nil
	})
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descActive, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, float64(n))
}
