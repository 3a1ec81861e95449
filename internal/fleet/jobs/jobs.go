// Package jobs runs the leader's singleton jobs. Each job declares its
// interval and runs only while this replica leads: the runner starts the
// jobs with the leader context of a term and they stop when it ends. Every
// write a job makes goes through the term fence (pgleader's InTerm), so a
// replica that lost leadership without noticing cannot commit. Last run,
// duration and error are kept as metrics, in memory and in job_runs.
package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/pgleader"
)

// Fence runs fn in a transaction that commits only while term is current
// (pgleader.Leadership.InTerm of the term).
type Fence func(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error

// Job is one singleton job.
type Job struct {
	Name     string
	Interval time.Duration
	// Run does one pass; its writes go through fence.
	Run func(ctx context.Context, fence Fence) error
}

// Status is the last run of a job on this replica.
type Status struct {
	Name       string        `json:"name"`
	Interval   time.Duration `json:"-"`
	IntervalS  float64       `json:"interval_s"`
	LastRun    time.Time     `json:"last_run"`
	DurationMS int64         `json:"duration_ms"`
	Error      string        `json:"error"`
	Runs       int64         `json:"runs"`
	Failures   int64         `json:"failures"`
	Term       int64         `json:"term"`
}

// Runner runs jobs under a leader context.
type Runner struct {
	jobs    []Job
	replica string
	log     *slog.Logger

	mu     sync.Mutex
	status map[string]*Status

	mLast     *prometheus.GaugeVec
	mDuration *prometheus.GaugeVec
	mErr      *prometheus.GaugeVec
	mRuns     *prometheus.CounterVec
	mFailures *prometheus.CounterVec
}

// NewRunner returns a runner; reg may be nil.
func NewRunner(jobs []Job, replica string, log *slog.Logger, reg prometheus.Registerer) *Runner {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Runner{jobs: jobs, replica: replica, log: log.With("component", "jobs"), status: map[string]*Status{},
		mLast:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "myriarch_job_last_run_timestamp_seconds", Help: "Start of the last run of a leader job."}, []string{"leader_job"}),
		mDuration: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "myriarch_job_last_duration_seconds", Help: "Duration of the last run of a leader job."}, []string{"leader_job"}),
		mErr:      prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "myriarch_job_last_run_failed", Help: "1 when the last run of a leader job failed."}, []string{"leader_job"}),
		mRuns:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "myriarch_job_runs_total", Help: "Runs of a leader job on this replica."}, []string{"leader_job"}),
		mFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "myriarch_job_failures_total", Help: "Failed runs of a leader job on this replica."}, []string{"leader_job"}),
	}
	for _, j := range jobs {
		r.status[j.Name] = &Status{Name: j.Name, Interval: j.Interval, IntervalS: j.Interval.Seconds()}
	}
	if reg != nil {
		reg.MustRegister(r.mLast, r.mDuration, r.mErr, r.mRuns, r.mFailures)
	}
	return r
}

// Statuses returns the jobs' last runs on this replica.
func (r *Runner) Statuses() []Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Status, 0, len(r.jobs))
	for _, j := range r.jobs {
		out = append(out, *r.status[j.Name])
	}
	return out
}

// Lead runs every job now and then every interval until leaderCtx ends,
// and returns when all of them have stopped. fence is the term's (its
// writes commit only while term is current).
func (r *Runner) Lead(leaderCtx context.Context, term int64, fence Fence) {
	var wg sync.WaitGroup
	for _, j := range r.jobs {
		wg.Go(func() {
			for {
				r.runOnce(leaderCtx, j, term, fence)
				select {
				case <-leaderCtx.Done():
					return
				case <-time.After(j.Interval):
				}
			}
		})
	}
	wg.Wait()
}

func (r *Runner) runOnce(ctx context.Context, j Job, term int64, fence Fence) {
	if ctx.Err() != nil {
		return
	}
	start := time.Now()
	err := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		return j.Run(ctx, fence)
	}()
	d := time.Since(start)
	if ctx.Err() != nil && err != nil {
		// Leadership ended during the run; not a failure of the job.
		return
	}
	msg := ""
	if err != nil {
		msg = err.Error()
		r.log.Warn("leader job failed", "job", j.Name, "error", err)
	}
	r.mu.Lock()
	s := r.status[j.Name]
	s.LastRun, s.DurationMS, s.Error, s.Term = start, d.Milliseconds(), msg, term
	s.Runs++
	if err != nil {
		s.Failures++
	}
	r.mu.Unlock()
	r.mLast.WithLabelValues(j.Name).Set(float64(start.UnixNano()) / 1e9)
	r.mDuration.WithLabelValues(j.Name).Set(d.Seconds())
	r.mRuns.WithLabelValues(j.Name).Inc()
	failed := 0.0
	if err != nil {
		failed = 1
		r.mFailures.WithLabelValues(j.Name).Inc()
	}
	r.mErr.WithLabelValues(j.Name).Set(failed)
	// The record of the run is itself a fenced write.
	rerr := fence(ctx, func(ctx context.Context, tx pgx.Tx) error {
		return store.RecordJobRun(ctx, tx, store.JobRun{Name: j.Name, ReplicaID: r.replica, Term: term, StartedAt: start,
			DurationMS: d.Milliseconds(), Error: msg})
	})
	if rerr != nil && ctx.Err() == nil {
		r.log.Warn("recording a job run failed", "job", j.Name, "error", rerr)
	}
}

// OfflineSweeper marks agents offline whose last-seen time is older than
// after, including those of a replica that died without its final flush.
func OfflineSweeper(interval, after time.Duration, onSwept func(n int)) Job {
	return Job{Name: "offline_sweeper", Interval: interval, Run: func(ctx context.Context, fence Fence) error {
		return fence(ctx, func(ctx context.Context, tx pgx.Tx) error {
			n, err := store.SweepOffline(ctx, tx, after)
			if err == nil && onSwept != nil {
				onSwept(int(n))
			}
			return err
		})
	}}
}

// Housekeeping prunes agent events older than eventRetention and the
// replica registry rows of lockKey (pgleader's registry) without heartbeat
// for longer than replicaRetention.
func Housekeeping(interval, eventRetention, replicaRetention time.Duration, lockKey int64) Job {
	return Job{Name: "housekeeping", Interval: interval, Run: func(ctx context.Context, fence Fence) error {
		return fence(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if err := store.PruneEvents(ctx, tx, eventRetention); err != nil {
				return err
			}
			_, err := pgleader.PruneReplicas(ctx, tx, lockKey, replicaRetention)
			return err
		})
	}}
}
