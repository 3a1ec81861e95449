package releases

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/myriarch/myriarch/internal/fleet/jobs"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
)

// PollTimeout bounds the listing of one source.
const PollTimeout = 5 * time.Minute

// Lister lists the new releases of one source.
type Lister interface {
	List(ctx context.Context, src Source, known func(version string) bool) ([]Release, error)
}

// Tracker is the release tracker job.
type Tracker struct {
	pool    *pgxpool.Pool
	listers map[string]Lister
	log     *slog.Logger
	// lockKey is ha.leaderLockKey: the term row that the job reads inside
	// its own fenced transaction, so the term it records is the one that
	// fence checked (never a later leadership of the replica).
	lockKey int64

	mPolls    *prometheus.CounterVec
	mFailed   *prometheus.GaugeVec
	mReleases *prometheus.CounterVec
	mLast     *prometheus.GaugeVec
}

// NewTracker returns the tracker. listers maps a source type to its lister;
// reg may be nil.
func NewTracker(pool *pgxpool.Pool, listers map[string]Lister, lockKey int64, log *slog.Logger, reg prometheus.Registerer) *Tracker {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &Tracker{pool: pool, listers: listers, lockKey: lockKey, log: log.With("component", "release_tracker"),
		mPolls:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "myriarch_release_polls_total", Help: "Polls of a package source by the release tracker."}, []string{"package"}),
		mFailed:   prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "myriarch_release_poll_failed", Help: "1 when the last poll of a package source failed."}, []string{"package"}),
		mReleases: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "myriarch_releases_recorded_total", Help: "Releases recorded by the release tracker."}, []string{"package"}),
		mLast:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "myriarch_release_last_poll_timestamp_seconds", Help: "End of the last poll of a package source."}, []string{"package"}),
	}
	if reg != nil {
		reg.MustRegister(t.mPolls, t.mFailed, t.mReleases, t.mLast)
	}
	return t
}

// Job returns the leader job that polls every source whose poll interval
// has passed; interval is how often it looks.
func (t *Tracker) Job(interval time.Duration) jobs.Job {
	return jobs.Job{Name: "release_tracker", Interval: interval, Run: t.Run}
}

// Run polls the due sources once. Sources fail independently; the
// returned error joins their errors.
func (t *Tracker) Run(ctx context.Context, fence jobs.Fence) error {
	srcs, err := ListSources(ctx, t.pool)
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range srcs {
		if s.LastPolledAt != nil && time.Since(*s.LastPolledAt) < s.PollInterval {
			continue
		}
		if err := t.poll(ctx, fence, s); err != nil {
			if ctx.Err() != nil {
				return err
			}
			errs = append(errs, fmt.Errorf("package %s: %w", s.Name, err))
		}
	}
	return errors.Join(errs...)
}

func (t *Tracker) poll(ctx context.Context, fence jobs.Fence, s Source) error {
	l, ok := t.listers[s.Type]
	if !ok {
		return fmt.Errorf("no lister for source type %q", s.Type)
	}
	known, err := knownVersions(ctx, t.pool, s.Name)
	if err != nil {
		return err
	}
	t.mPolls.WithLabelValues(s.Name).Inc()
	lctx, cancel := context.WithTimeout(ctx, PollTimeout)
	rels, lerr := l.List(lctx, s, func(v string) bool { return known[v] })
	cancel()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	msg := ""
	if lerr != nil {
		msg = lerr.Error()
		t.log.Warn("polling a package source failed", "package", s.Name, "source", s.Source, "error", lerr)
	}
	// Releases listed before an error are still recorded.
	err = rollout.InTerm(ctx, fence, t.lockKey, func(ctx context.Context, tx pgx.Tx, term int64) error {
		for _, r := range rels {
			if err := RecordRelease(ctx, tx, r, term); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `UPDATE package_sources SET last_polled_at = now(), last_error = $2 WHERE name = $1`, s.Name, msg)
		return err
	})
	if err != nil {
		return err
	}
	for _, r := range rels {
		t.log.Info("new release recorded", "package", r.Package, "version", r.Version, "assets", len(r.Assets))
	}
	t.mReleases.WithLabelValues(s.Name).Add(float64(len(rels)))
	t.mLast.WithLabelValues(s.Name).Set(float64(time.Now().UnixNano()) / 1e9)
	if lerr != nil {
		t.mFailed.WithLabelValues(s.Name).Set(1)
		return lerr
	}
	t.mFailed.WithLabelValues(s.Name).Set(0)
	return nil
}
