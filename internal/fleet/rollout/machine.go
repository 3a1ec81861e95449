package rollout

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// This file is the one step machine of both kinds of progressive rollout
// (configuration revisions here, package versions in package upgrades):
// operator commands, planning, observing, the failure rule, dispatch
// within max_in_progress, the wave gate (Spec.Gate), opening the next
// wave, success and rollback. A kind (Kind) says what its target is
// through the tables its own package owns: how the agents are planned,
// what "applied" means (an APPLIED report of the revision's hash, an
// installed report of the offered package hash), how the target is
// pushed (a desired-config write, a package offer) and how it is rolled
// back. Every step is one transaction of the job's own term (RunSteps).
//
// Where the two engines differed before they shared this machine, the
// decisions (and why) are in docs/myriarchd.md ("One engine for both
// kinds of rollout") and on the Kind methods below.

// Job is the state of one rollout as the machine works on it. A kind
// loads it (Kind.Begin) and writes it back (Steps.Save).
type Job struct {
	ID   int64
	Spec Spec
	// State, Requested (an operator command not carried out yet), Reason.
	State, Requested, Reason string
	// Wave is the current wave, 1-based (0 before planning); Waves the
	// number of waves.
	Wave, Waves int
	// Term is the job's term of this step.
	Term int64
	// Now is the database clock of the step's transaction: timeouts and
	// bakes of both kinds are measured on it.
	Now time.Time
}

// Kind is one kind of target: a Target (RunSteps) whose Step is the
// machine's (Machine).
type Kind interface {
	// Kind names the rollouts in errors ("rollout", "package rollout").
	Kind() string
	// Active returns the ids of the rollouts still worked on, in order.
	Active(ctx context.Context) ([]int64, error)
	// Begin locks and loads rollout id for one step in tx (a transaction
	// of term); ok false: nothing to do (not found or no longer active).
	Begin(ctx context.Context, tx pgx.Tx, term, id int64) (s Steps, j Job, ok bool, err error)
}

// Steps is what a kind does in one step of one rollout; every method
// writes through the step's transaction only.
type Steps interface {
	// RollBackTo names what a rollback would restore ("revision 3");
	// "": nothing to roll back to.
	RollBackTo(j *Job) string
	// What names the target in reasons ("the revision", "the version").
	What() string
	// Plan selects and orders the agents and splits them into the waves
	// of the spec: it sets Waves, Wave 1 and StateRunning, or a final
	// state with its reason (nothing to do, refused).
	Plan(ctx context.Context, j *Job) error
	// Observe reads the agents' reports: in progress → applied or failed
	// (a FAILED/install-failed report, applied but unhealthy, no report
	// within apply_timeout_s), and an agent of the current wave that
	// applied and turned unhealthy during the bake → failed.
	Observe(ctx context.Context, j *Job) error
	// Failures are the failed agents that count (since the last resume)
	// and the planned agents.
	Failures(ctx context.Context, j *Job) (failed, planned int, err error)
	// Forgive acknowledges the failures so far (an operator's resume).
	Forgive(ctx context.Context, j *Job) error
	// Dispatch sends the target to the next pending agents of the current
	// wave, within max_in_progress (Spec.Room); an agent offline at its
	// turn is skipped.
	Dispatch(ctx context.Context, j *Job) error
	// Tally reads the current wave for the gate (Spec.Gate); Failed
	// counts only failures that count.
	Tally(ctx context.Context, j *Job) (WaveTally, error)
	// WaveDone records that no agent of the current wave is pending or in
	// progress any more; GatePassed that its gate passed; WaveStarted that
	// the (new) current wave started.
	WaveDone(ctx context.Context, j *Job) error
	GatePassed(ctx context.Context, j *Job) error
	WaveStarted(ctx context.Context, j *Job) error
	// Succeed records the end of a rollout whose last gate passed.
	Succeed(ctx context.Context, j *Job) error
	// RollBack sends the previous target to every agent that was sent
	// the new one; done when the rollback is complete.
	RollBack(ctx context.Context, j *Job) (done bool, err error)
	// Save writes the job back when it changed (before is the job as
	// loaded), with the term.
	Save(ctx context.Context, before, j Job) error
}

// Machine is the Target (RunSteps) that drives the rollouts of kind k.
func Machine(k Kind) Target { return machine{k} }

type machine struct{ k Kind }

func (m machine) Kind() string                                { return m.k.Kind() }
func (m machine) Active(ctx context.Context) ([]int64, error) { return m.k.Active(ctx) }

func (m machine) Step(ctx context.Context, tx pgx.Tx, term, id int64) error {
	s, j, ok, err := m.k.Begin(ctx, tx, term, id)
	if err != nil || !ok || !j.active() {
		return err
	}
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&j.Now); err != nil {
		return err
	}
	before := j
	if err := command(ctx, s, &j); err != nil {
		return err
	}
	switch j.State {
	case StatePending:
		err = plan(ctx, s, &j)
	case StateRunning, StatePaused:
		err = run(ctx, s, &j)
	case StateRollingBack:
		err = rollBack(ctx, s, &j)
	}
	if err != nil {
		return err
	}
	return s.Save(ctx, before, j)
}

func (j Job) active() bool {
	for _, s := range ActiveStates {
		if j.State == s {
			return true
		}
	}
	return false
}

// command carries out an operator request. Commands that do not fit the
// state are dropped (the services refuse them when they are requested).
func command(ctx context.Context, s Steps, j *Job) error {
	cmd := j.Requested
	if cmd == "" {
		return nil
	}
	j.Requested = ""
	switch cmd {
	case CmdPause:
		switch j.State {
		case StatePending:
			// Planned first, so that a paused rollout shows its waves;
			// plan pauses it before anything is sent.
			j.Requested = cmd
		case StateRunning:
			j.State, j.Reason = StatePaused, "paused by an operator"
		}
	case CmdResume:
		if j.State == StatePaused {
			if err := s.Forgive(ctx, j); err != nil {
				return err
			}
			j.State, j.Reason = StateRunning, ""
		}
	case CmdAbort:
		j.State, j.Reason = StateAborted, "aborted by an operator; agents keep what they have"
	case CmdRollback:
		if j.State == StateRunning || j.State == StatePaused {
			if s.RollBackTo(j) == "" {
				j.Reason = "rollback refused: the rollout has nothing to roll back to"
			} else {
				j.State, j.Reason = StateRollingBack, "rollback requested by an operator"
			}
		}
	}
	return nil
}

func plan(ctx context.Context, s Steps, j *Job) error {
	if err := s.Plan(ctx, j); err != nil || j.State != StateRunning {
		return err
	}
	if j.Requested == CmdPause {
		j.Requested, j.State, j.Reason = "", StatePaused, "paused by an operator"
		return nil
	}
	return run(ctx, s, j)
}

// run observes, applies the failure rule, dispatches and passes gates,
// as many waves as are ready in this step.
func run(ctx context.Context, s Steps, j *Job) error {
	if err := s.Observe(ctx, j); err != nil {
		return err
	}
	if j.State != StateRunning {
		return nil
	}
	for {
		failed, planned, err := s.Failures(ctx, j)
		if err != nil {
			return err
		}
		if j.Spec.TooManyFailed(failed, planned) {
			return fail(ctx, s, j, fmt.Sprintf("%d of %d agents failed (max_failed %d, max_failed_percent %g)", failed, planned,
				j.Spec.MaxFailed, j.Spec.MaxFailedPercent))
		}
		if err := s.Dispatch(ctx, j); err != nil {
			return err
		}
		advanced, err := gate(ctx, s, j)
		if err != nil || !advanced || j.State != StateRunning {
			return err
		}
	}
}

// fail applies the failure policy (Spec.FailureState).
func fail(ctx context.Context, s Steps, j *Job, why string) error {
	to := s.RollBackTo(j)
	switch j.State = j.Spec.FailureState(to != ""); {
	case j.State == StateRollingBack:
		j.Reason = why + "; rolling back to " + to
		return rollBack(ctx, s, j)
	case j.Spec.FailurePolicy == PolicyRollback:
		j.Reason = why + "; paused: nothing to roll back to"
	default:
		j.Reason = why + "; paused (failure_policy pause)"
	}
	return nil
}

// gate passes the current wave's gate when Spec.Gate says so and opens
// the next wave (or ends the rollout); advanced: a new wave is open.
func gate(ctx context.Context, s Steps, j *Job) (advanced bool, err error) {
	w, err := s.Tally(ctx, j)
	if err != nil || w.Open > 0 {
		return false, err
	}
	if err := s.WaveDone(ctx, j); err != nil {
		return false, err
	}
	switch v, why := j.Spec.Gate(w, s.What()); v {
	case GateWait:
		return false, nil
	case GateFail:
		return false, fail(ctx, s, j, why)
	}
	if err := s.GatePassed(ctx, j); err != nil {
		return false, err
	}
	if j.Wave >= j.Waves {
		j.State, j.Reason = StateSucceeded, ""
		return false, s.Succeed(ctx, j)
	}
	j.Wave++
	return true, s.WaveStarted(ctx, j)
}

func rollBack(ctx context.Context, s Steps, j *Job) error {
	if s.RollBackTo(j) == "" {
		j.State, j.Reason = StatePaused, "cannot roll back: nothing to roll back to"
		return nil
	}
	done, err := s.RollBack(ctx, j)
	if err == nil && done {
		j.State = StateRolledBack
	}
	return err
}
