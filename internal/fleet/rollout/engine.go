package rollout

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/myriarch/myriarch/internal/fleet/jobs"
	"github.com/myriarch/myriarch/pgleader"
)

// This file is the progressive-rollout engine that both kinds of rollout
// run on: configuration rollouts (this package, the target is a
// configuration revision) and package rollouts (package upgrades, the
// target is a package version). What is shared lives here: the job's pass
// over the active rollouts with its one fence discipline (every step is
// one transaction of the job's own term, InTerm), the failure threshold
// and policy, the wave gate's bake, max_in_progress, and the operator
// commands, and the step machine (machine.go) with its gate rule
// (Spec.Gate). What a kind supplies (Kind, Steps) is how it lists its
// active rollouts and how one step reads its agents' progress and health
// and sends its target to them, through the tables its own package owns.

// Target is one kind of progressive rollout as the engine drives it.
type Target interface {
	// Kind names the rollouts in errors ("rollout", "package rollout").
	Kind() string
	// Active returns the ids of the rollouts the engine still works on,
	// in the order their steps run.
	Active(ctx context.Context) ([]int64, error)
	// Step takes rollout id one step. tx is a transaction of the job's
	// term, which is term: every write of the step goes through it.
	Step(ctx context.Context, tx pgx.Tx, term, id int64) error
}

// RunSteps is one pass of the engine over the active rollouts of t: each
// takes one step, in its own transaction fenced by the job's term (InTerm
// of fence, the job's fence, with lockKey, ha.leaderLockKey; 0 is
// pgleader's default, as in pgleader.Config). A stale term or the end of
// leadership ends the pass at once (no later step could commit); the
// errors of other steps are collected and the pass goes on.
func RunSteps(ctx context.Context, fence jobs.Fence, lockKey int64, t Target) error {
	ids, err := t.Active(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		err := InTerm(ctx, fence, lockKey, func(ctx context.Context, tx pgx.Tx, term int64) error {
			return t.Step(ctx, tx, term, id)
		})
		if errors.Is(err, pgleader.ErrStaleTerm) || ctx.Err() != nil {
			return err
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %d: %w", t.Kind(), id, err))
		}
	}
	return errors.Join(errs...)
}

// InTerm is the one function through which every write of the rollout
// engines and of GitOps goes: fn runs in a transaction fenced by the
// current term (jobs.Fence, pgleader's InTerm) and is given that term.
// lockKey 0 is pgleader.DefaultLockKey.
func InTerm(ctx context.Context, fence jobs.Fence, lockKey int64, fn func(ctx context.Context, tx pgx.Tx, term int64) error) error {
	if lockKey == 0 {
		lockKey = pgleader.DefaultLockKey
	}
	return fence(ctx, func(ctx context.Context, tx pgx.Tx) error {
		rec, ok, err := pgleader.CurrentTerm(ctx, tx, lockKey)
		if err != nil {
			return fmt.Errorf("reading the term: %w", err)
		}
		if !ok {
			return fmt.Errorf("reading the term: no term recorded for lock key %d", lockKey)
		}
		return fn(ctx, tx, rec.Term)
	})
}

// Commands are the operator commands of both kinds of rollout.
var Commands = []string{CmdPause, CmdResume, CmdAbort, CmdRollback}

// TooManyFailed applies the failure threshold: more than MaxFailed agents,
// or more than MaxFailedPercent % of planned, failed since the last resume.
// With only MaxFailedPercent set (MaxFailed 0), only the share counts.
func (s Spec) TooManyFailed(failed, planned int) bool {
	if s.MaxFailedPercent > 0 && planned > 0 && float64(failed)*100 > s.MaxFailedPercent*float64(planned) {
		return true
	}
	if s.MaxFailedPercent > 0 && s.MaxFailed == 0 {
		return false
	}
	return failed > s.MaxFailed
}

// FailureState is the state a rollout that failed its threshold goes to
// under the failure policy: rolling_back when the policy is rollback and
// there is something to roll back to (canRollBack), else paused.
func (s Spec) FailureState(canRollBack bool) string {
	if s.FailurePolicy == PolicyRollback && canRollBack {
		return StateRollingBack
	}
	return StatePaused
}

// Room is how many more agents may be sent the target now that inProgress
// are in progress (max_in_progress); 0 or less: none.
func (s Spec) Room(inProgress int) int { return s.MaxInProgress - inProgress }

// Baked reports whether an agent that has been healthy since since (nil:
// not yet) has passed the bake at now.
func (s Spec) Baked(since *time.Time, now time.Time) bool {
	return since != nil && now.Sub(*since) >= s.Bake()
}

// TimedOut reports whether an agent sent the target at sentAt (nil: not
// sent) is past apply_timeout at now without a report.
func (s Spec) TimedOut(sentAt *time.Time, now time.Time) bool {
	return sentAt != nil && now.Sub(*sentAt) > s.ApplyTimeout()
}

// WaveTally is what the gate reads of the current wave.
type WaveTally struct {
	// Wave is the wave's number as the rollout shows it (1-based).
	Wave int
	// Open: agents pending or in progress.
	Open int
	// Baking: agents that applied the target and have not been healthy
	// for the whole bake yet.
	Baking int
	// Held: agents that applied the target and stayed healthy for the
	// whole bake.
	Held int
	// Failed: agents of the wave that failed and count (a resume forgives
	// the failures before it).
	Failed int
}

// GateVerdict is what the gate decides about the current wave.
type GateVerdict int

// Gate verdicts.
const (
	// GateWait: agents of the wave are still pending, in progress or
	// baking.
	GateWait GateVerdict = iota
	// GatePass: the next wave may open (or the rollout succeeds).
	GatePass
	// GateFail: the wave is done but no agent of it held the target: the
	// failure policy applies, whatever max_failed allows.
	GateFail
)

// Gate is the one gate rule of both kinds of rollout. A wave's gate needs
// every agent of the wave to be done (applied, failed or skipped), every
// one that applied to have stayed healthy for bake_s, and at least one
// agent that applied and held: max_failed lets a rollout go on past a few
// failures, not open a wave after one in which the target worked nowhere
// (a canary whose agents all failed). A wave in which no agent was sent
// the target (all offline at their turn, or failures forgiven by a
// resume) passes: nothing in it spoke against the target, and its skipped
// agents are reported. why explains a GateFail; what names the target
// ("the revision", "the version").
func (s Spec) Gate(w WaveTally, what string) (v GateVerdict, why string) {
	switch {
	case w.Open > 0 || w.Baking > 0:
		return GateWait, ""
	case w.Held == 0 && w.Failed > 0:
		return GateFail, fmt.Sprintf("wave %d: no agent applied %s and stayed healthy for bake_s (%g s); %d failed (max_failed %d, max_failed_percent %g allow failures, not a wave without a healthy agent)",
			w.Wave, what, s.Bake().Seconds(), w.Failed, s.MaxFailed, s.MaxFailedPercent)
	}
	return GatePass, ""
}
