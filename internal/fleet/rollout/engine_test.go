package rollout_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/pgleader"
)

// fakeTarget records the steps the engine runs and fails the ones in errs.
type fakeTarget struct {
	ids   []int64
	errs  map[int64]error
	steps []int64
	terms []int64
}

func (*fakeTarget) Kind() string { return "test rollout" }

func (f *fakeTarget) Active(context.Context) ([]int64, error) { return f.ids, nil }

func (f *fakeTarget) Step(ctx context.Context, tx pgx.Tx, term, id int64) error {
	f.steps, f.terms = append(f.steps, id), append(f.terms, term)
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
		return err
	}
	return f.errs[id]
}

// One pass of the engine: every step in a transaction of the job's term,
// given that term; a failing step does not stop the pass, a stale term does.
func TestRunStepsOneFencePerStep(t *testing.T) {
	ctx, _, el := fleettest.LeaderStore(t, 4)

	f := &fakeTarget{ids: []int64{1, 2, 3}, errs: map[int64]error{2: errors.New("boom")}}
	err := rollout.RunSteps(ctx, el.InTerm, 0, f)
	if err == nil || !strings.Contains(err.Error(), "test rollout 2: boom") || errors.Is(err, pgleader.ErrStaleTerm) {
		t.Fatalf("pass with one failing step: %v", err)
	}
	if len(f.steps) != 3 {
		t.Fatalf("steps after a failing one: %v", f.steps)
	}
	for _, term := range f.terms {
		if term != el.Term() {
			t.Fatalf("step given term %d, the job's is %d", term, el.Term())
		}
	}

	f = &fakeTarget{ids: []int64{1, 2, 3}, errs: map[int64]error{2: &pgleader.StaleTermError{Term: el.Term(), Reason: "test"}}}
	if err := rollout.RunSteps(ctx, el.InTerm, pgleader.DefaultLockKey, f); !errors.Is(err, pgleader.ErrStaleTerm) {
		t.Fatalf("stale term: %v", err)
	}
	if len(f.steps) != 2 {
		t.Fatalf("steps after a stale term: %v (the pass must end)", f.steps)
	}

	// A fence of another lock key has no term: nothing runs.
	f = &fakeTarget{ids: []int64{1}}
	if err := rollout.RunSteps(ctx, el.InTerm, 42, f); err == nil || !strings.Contains(err.Error(), "no term recorded for lock key 42") || len(f.steps) != 0 {
		t.Fatalf("unknown lock key: %v, steps %v", err, f.steps)
	}
}

// The gate and failure rules that both kinds of rollout apply.
func TestSpecGateRules(t *testing.T) {
	sp := rollout.Spec{MaxInProgress: 2, BakeS: rollout.Secs(10), ApplyTimeoutS: 30, MaxFailed: 1, FailurePolicy: rollout.PolicyRollback}
	now := time.Now()
	at := func(ago time.Duration) *time.Time { t := now.Add(-ago); return &t }
	for _, c := range []struct {
		name string
		got  bool
		want bool
	}{
		{"baked after bake_s", sp.Baked(at(10*time.Second), now), true},
		{"not baked before bake_s", sp.Baked(at(9*time.Second), now), false},
		{"not baked when not healthy", sp.Baked(nil, now), false},
		{"timed out after apply_timeout_s", sp.TimedOut(at(31*time.Second), now), true},
		{"not timed out at apply_timeout_s", sp.TimedOut(at(30*time.Second), now), false},
		{"not timed out when not sent", sp.TimedOut(nil, now), false},
		{"room below max_in_progress", sp.Room(1) > 0, true},
		{"no room at max_in_progress", sp.Room(2) > 0, false},
		{"max_failed not exceeded", sp.TooManyFailed(1, 10), false},
		{"max_failed exceeded", sp.TooManyFailed(2, 10), true},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %v", c.name, c.got)
		}
	}
	if s := sp.FailureState(true); s != rollout.StateRollingBack {
		t.Errorf("rollback policy with a target to go back to: %s", s)
	}
	if s := sp.FailureState(false); s != rollout.StatePaused {
		t.Errorf("rollback policy without one: %s", s)
	}
	sp.FailurePolicy = rollout.PolicyPause
	if s := sp.FailureState(true); s != rollout.StatePaused {
		t.Errorf("pause policy: %s", s)
	}
}
