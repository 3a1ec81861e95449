package telemetry

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

type rowKey struct {
	uid    string
	tier   int16
	bucket int64
}

// Batcher holds received samples until its next flush and answers which
// series an agent has (for telemetry.maxSeriesPerAgent).
type Batcher struct {
	pool      *pgxpool.Pool
	tiers     Tiers
	interval  time.Duration
	maxSeries int
	maxRows   int
	log       *slog.Logger
	now       func() time.Time

	mu      sync.Mutex
	pending map[rowKey]map[string]float64
	// known is the series each agent sent here (bounded by maxSeries);
	// forgotten after a coarse retention without a sample.
	known map[string]*agentSeries

	flushMu sync.Mutex

	mSamples  prometheus.Counter
	mDropped  *prometheus.CounterVec
	mRows     prometheus.Counter
	mFailures prometheus.Counter
	mFlushes  prometheus.Counter
}

type agentSeries struct {
	keys map[string]struct{}
	last time.Time
}

// BatcherOptions configure a Batcher.
type BatcherOptions struct {
	Pool  *pgxpool.Pool
	Tiers Tiers
	// FlushInterval is telemetry.flushInterval.
	FlushInterval time.Duration
	// MaxSeriesPerAgent is telemetry.maxSeriesPerAgent.
	MaxSeriesPerAgent int
	// MaxPendingRows bounds what waits for a flush (rows of an agent,
	// tier and bucket); beyond it samples are dropped and counted. Default
	// 1,000,000.
	MaxPendingRows int
	Log            *slog.Logger
	Registerer     prometheus.Registerer
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// NewBatcher returns a batcher; Run flushes it.
func NewBatcher(o BatcherOptions) *Batcher {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxPendingRows <= 0 {
		o.MaxPendingRows = 1_000_000
	}
	if o.MaxSeriesPerAgent <= 0 {
		o.MaxSeriesPerAgent = 256
	}
	b := &Batcher{pool: o.Pool, tiers: o.Tiers, interval: o.FlushInterval, maxSeries: o.MaxSeriesPerAgent, maxRows: o.MaxPendingRows,
		log: o.Log.With("component", "telemetry"), now: o.Now, pending: map[rowKey]map[string]float64{}, known: map[string]*agentSeries{},
		mSamples: prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_telemetry_samples_total", Help: "Samples of agents' own metrics received and kept (catalog series)."}),
		mDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "myriarch_telemetry_samples_dropped_total",
			Help: "Samples of agents' own metrics dropped, by reason: series_limit (telemetry.maxSeriesPerAgent), pending_limit (a flush could not keep up)."}, []string{"reason"}),
		mRows:     prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_telemetry_rows_written_total", Help: "Rows of agent_telemetry written (inserted or merged)."}),
		mFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_telemetry_flush_failures_total", Help: "Failed flushes of agents' own metrics (the batch is kept for the next one)."}),
		mFlushes:  prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_telemetry_flushes_total", Help: "Flushes of agents' own metrics."}),
	}
	b.mDropped.WithLabelValues("series_limit")
	b.mDropped.WithLabelValues("pending_limit")
	if o.Registerer != nil {
		o.Registerer.MustRegister(b.mSamples, b.mDropped, b.mRows, b.mFailures, b.mFlushes)
	}
	return b
}

// Add keeps the samples of agent uid received now. It returns how many
// were kept.
func (b *Batcher) Add(uid string, samples map[Key]float64) int {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	as := b.known[uid]
	if as == nil {
		as = &agentSeries{keys: map[string]struct{}{}}
		b.known[uid] = as
	}
	as.last = now
	kept := make(map[string]float64, len(samples))
	for k, v := range samples {
		ks := k.String()
		if _, ok := as.keys[ks]; !ok {
			if len(as.keys) >= b.maxSeries {
				b.mDropped.WithLabelValues("series_limit").Inc()
				continue
			}
			as.keys[ks] = struct{}{}
		}
		kept[ks] = v
	}
	if len(kept) == 0 {
		return 0
	}
	for tier := range 2 {
		rk := rowKey{uid: uid, tier: int16(tier), bucket: b.tiers.Bucket(tier, now)}
		row := b.pending[rk]
		if row == nil {
			if len(b.pending) >= b.maxRows {
				b.mDropped.WithLabelValues("pending_limit").Add(float64(len(kept)))
				return 0
			}
			row = make(map[string]float64, len(kept))
			b.pending[rk] = row
		}
		for k, v := range kept {
			row[k] = v
		}
		row[SampledAtKey] = float64(now.UnixMilli()) / 1000
	}
	b.mSamples.Add(float64(len(kept)))
	return len(kept)
}

// Pending is the number of rows waiting for a flush.
func (b *Batcher) Pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending)
}

// Run flushes every interval until ctx ends, then once more within 5 s.
func (b *Batcher) Run(ctx context.Context) {
	t := time.NewTicker(b.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := b.Flush(fctx); err != nil {
				b.log.Warn("the last flush of agents' own metrics failed; they are lost", "error", err)
			}
			cancel()
			return
		case <-t.C:
			if err := b.Flush(ctx); err != nil && ctx.Err() == nil {
				b.log.Warn("flushing agents' own metrics failed; retrying at the next flush", "error", err)
			}
			b.forget()
		}
	}
}

// forget drops the series lists of agents silent for a coarse retention.
func (b *Batcher) forget() {
	cut := b.now().Add(-b.tiers.CoarseRetention)
	b.mu.Lock()
	defer b.mu.Unlock()
	for uid, as := range b.known {
		if as.last.Before(cut) {
			delete(b.known, uid)
		}
	}
}

// appendSeries appends s as a JSON object. encoding/json's reflection
// over the maps was a tenth of the replica's CPU at 10,000 agents; the
// values are finite (Samples drops the others) and the keys are catalog
// names and components that are UTF-8 without control characters
// (validComponent), so '"' and '\\' are escaped, and a control byte (never
// there) is written as U+FFFD: PostgreSQL refuses \u0000 in jsonb, and
// one bad row would fail every agent's flush.
func appendSeries(b []byte, s map[string]float64) []byte {
	b = append(b, '{')
	first := true
	for k, v := range s {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, '"')
		for i := 0; i < len(k); i++ {
			switch c := k[i]; {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20:
				b = append(b, `\ufffd`...)
			default:
				b = append(b, c)
			}
		}
		b = append(b, '"', ':')
		if math.IsNaN(v) || math.IsInf(v, 0) {
			v = 0 // not kept by Samples; never written as an invalid document
		}
		b = strconv.AppendFloat(b, v, 'g', -1, 64)
	}
	return append(b, '}')
}

// Flush writes every pending row in one statement; a row already in the
// table (another flush or replica wrote the bucket) is merged, the newer
// values winning. What fails is put back (newer values win).
func (b *Batcher) Flush(ctx context.Context) error {
	b.flushMu.Lock()
	defer b.flushMu.Unlock()
	b.mu.Lock()
	rows := b.pending
	b.pending = make(map[rowKey]map[string]float64, len(rows))
	b.mu.Unlock()
	if len(rows) == 0 {
		return nil
	}
	b.mFlushes.Inc()
	uids := make([]string, 0, len(rows))
	tiers := make([]int16, 0, len(rows))
	buckets := make([]int64, 0, len(rows))
	series := make([]string, 0, len(rows))
	var buf []byte
	for k, s := range rows {
		buf = appendSeries(buf[:0], s)
		uids, tiers, buckets, series = append(uids, k.uid), append(tiers, k.tier), append(buckets, k.bucket), append(series, string(buf))
	}
	_, err := b.pool.Exec(ctx, `INSERT INTO agent_telemetry (instance_uid, tier, bucket, series)
		SELECT * FROM unnest($1::text[], $2::smallint[], $3::bigint[], $4::jsonb[])
		ON CONFLICT (instance_uid, tier, bucket) DO UPDATE SET series = agent_telemetry.series || EXCLUDED.series`,
		uids, tiers, buckets, series)
	if err != nil {
		b.mFailures.Inc()
		b.mu.Lock()
		for k, s := range rows {
			cur := b.pending[k]
			if cur == nil {
				b.pending[k] = s
				continue
			}
			for n, v := range s {
				if _, newer := cur[n]; !newer {
					cur[n] = v
				}
			}
		}
		b.mu.Unlock()
		return errors.Join(errors.New("writing agent_telemetry"), err)
	}
	b.mRows.Add(float64(len(rows)))
	return nil
}
