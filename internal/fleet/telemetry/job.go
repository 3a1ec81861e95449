package telemetry

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/myriarch/myriarch/internal/fleet/jobs"
)

// AgentCounter is how the job counts agents by status (store.Store.Counts).
type AgentCounter interface {
	Counts(ctx context.Context) (online, offline, unhealthy int64, err error)
}

// JobName is the leader job's name.
const JobName = "telemetry"

// Job is the leader's telemetry job, run every coarse resolution: it
// computes the fleet's sums of the last complete coarse bucket
// (fleet_telemetry) and deletes what is older than each tier's retention
// (and fleet sums older than the coarse retention). Every write goes
// through the term's fence.
func (r *Reader) Job(counts AgentCounter, agg *Aggregates) jobs.Job {
	return jobs.Job{Name: JobName, Interval: r.Tiers.CoarseResolution, Run: func(ctx context.Context, fence jobs.Fence) error {
		return r.runJob(ctx, fence, counts, agg)
	}}
}

func (r *Reader) runJob(ctx context.Context, fence jobs.Fence, counts AgentCounter, agg *Aggregates) error {
	now := r.now()
	res := r.Tiers.res(1)
	// The last complete coarse bucket, and the one before it for rates.
	cur := r.Tiers.Bucket(1, now) - res
	sums, reporting, err := r.fleetSums(ctx, cur, res)
	if err != nil {
		return err
	}
	online, offline, unhealthy, err := counts.Counts(ctx)
	if err != nil {
		return err
	}
	sums["agents.online"], sums["agents.offline"], sums["agents.unhealthy"] = float64(online), float64(offline), float64(unhealthy)
	sums["agents.reporting"] = float64(reporting)
	if agg != nil {
		agg.set(sums)
	}
	return fence(ctx, func(ctx context.Context, tx pgx.Tx) error {
		b := &pgx.Batch{}
		for n, v := range sums {
			b.Queue(`INSERT INTO fleet_telemetry (bucket, name, value) VALUES ($1, $2, $3)
				ON CONFLICT (bucket, name) DO UPDATE SET value = EXCLUDED.value`, cur, n, v)
		}
		b.Queue(`DELETE FROM agent_telemetry WHERE tier = 0 AND bucket < $1`, now.Add(-r.Tiers.FineRetention).Unix())
		b.Queue(`DELETE FROM agent_telemetry WHERE tier = 1 AND bucket < $1`, now.Add(-r.Tiers.CoarseRetention).Unix())
		b.Queue(`DELETE FROM fleet_telemetry WHERE bucket < $1`, now.Add(-r.Tiers.CoarseRetention).Unix())
		return tx.SendBatch(ctx, b).Close()
	})
}

// fleetSums adds up, over every agent, the rates of the coarse bucket cur
// (from the bucket before) per class; reporting is how many agents sent
// in cur.
func (r *Reader) fleetSums(ctx context.Context, cur, res int64) (map[string]float64, int, error) {
	// Grouped here, not sorted by PostgreSQL: at 10,000 agents the ORDER
	// BY sorted 20,000 rows of about 1.5 KB on disk (past work_mem), 3 to
	// 8 s of the job's run.
	rows, err := r.Pool.Query(ctx, `SELECT instance_uid, bucket, series FROM agent_telemetry
		WHERE tier = 1 AND bucket IN ($1, $2)`, cur-res, cur)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	type pair struct{ prev, cur *bucketRow }
	byUID := map[string]*pair{}
	for rows.Next() {
		var u string
		var br bucketRow
		var raw []byte
		if err := rows.Scan(&u, &br.bucket, &raw); err != nil {
			return nil, 0, err
		}
		if err := json.Unmarshal(raw, &br.series); err != nil {
			return nil, 0, err
		}
		p := byUID[u]
		if p == nil {
			p = &pair{}
			byUID[u] = p
		}
		if br.bucket == cur {
			p.cur = &br
		} else {
			p.prev = &br
		}
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	sums := map[string]float64{"throughput": 0, "refused": 0, "failed": 0}
	reporting := 0
	group := make([]bucketRow, 0, 2)
	for _, p := range byUID {
		if p.cur == nil {
			continue // nothing sent in cur: no rate, not reporting
		}
		reporting++
		group = group[:0]
		if p.prev != nil {
			group = append(group, *p.prev)
		}
		group = append(group, *p.cur)
		for _, s := range Rates(group, res, cur) {
			c := Catalog[s.Name].Class
			if c == "" {
				continue
			}
			for _, pt := range s.Points {
				sums[c] += pt[1]
			}
		}
	}
	return sums, reporting, nil
}

// Aggregates are the fleet sums of the job's last run on this replica, as
// metrics (myriarch_fleet_telemetry_*), for the alert rules. Only the
// leader computes them; another replica exports only
// myriarch_fleet_telemetry_computed_timestamp_seconds 0.
type Aggregates struct {
	mu       sync.Mutex
	vals     map[string]float64
	computed time.Time
}

// NewAggregates returns empty aggregates.
func NewAggregates() *Aggregates {
	return &Aggregates{vals: map[string]float64{}}
}

func (a *Aggregates) set(v map[string]float64) {
	a.mu.Lock()
	a.vals = v
	a.computed = time.Now()
	a.mu.Unlock()
}

var (
	descThroughput = prometheus.NewDesc("myriarch_fleet_telemetry_items_per_second",
		"Fleet-wide rate of the agents' own metrics over the last complete coarse bucket, by class: throughput (collector receivers' accepted items and bridge routes' received messages), refused, failed (receivers' and exporters' failed items, bridge dead letters). Computed by the leader's telemetry job.",
		[]string{"class"}, nil)
	descAgents = prometheus.NewDesc("myriarch_fleet_telemetry_agents_reporting",
		"Agents that sent their own metrics in the last complete coarse bucket (leader only).", nil, nil)
	descComputed = prometheus.NewDesc("myriarch_fleet_telemetry_computed_timestamp_seconds",
		"When this replica last computed the fleet's telemetry sums (0: never; only the leader does).", nil, nil)
)

// Describe implements prometheus.Collector.
func (a *Aggregates) Describe(ch chan<- *prometheus.Desc) {
	ch <- descThroughput
	ch <- descAgents
	ch <- descComputed
}

// Collect implements prometheus.Collector: nothing but the timestamp
// until the job ran here.
func (a *Aggregates) Collect(ch chan<- prometheus.Metric) {
	a.mu.Lock()
	vals, at := a.vals, a.computed
	a.mu.Unlock()
	ts := 0.0
	if !at.IsZero() {
		ts = float64(at.Unix())
	}
	ch <- prometheus.MustNewConstMetric(descComputed, prometheus.GaugeValue, ts)
	if at.IsZero() {
		return
	}
	for _, c := range []string{"throughput", "refused", "failed"} {
		ch <- prometheus.MustNewConstMetric(descThroughput, prometheus.GaugeValue, vals[c], c)
	}
	ch <- prometheus.MustNewConstMetric(descAgents, prometheus.GaugeValue, vals["agents.reporting"])
}
