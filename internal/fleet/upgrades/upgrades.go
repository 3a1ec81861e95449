// Package upgrades runs upgrades of agent software as rollouts: a leader
// job takes a package version to the agents that match a selector, wave by
// wave, with the Spec of configuration rollouts (package rollout): waves,
// max_in_progress, bake_s, apply_timeout_s, failure_policy, max_failed.
//
// The job is the rollout engine (rollout.RunSteps over rollout.Machine,
// the step machine configuration rollouts run on) with a package-version
// kind: each step of a rollout is one transaction of
// the job's own term, which the rollout row records. Sending an agent
// the version is an offer (package artifacts: OpAMP PackagesAvailable with
// the download URL, content hash and signature) recorded with the package
// hash it must report. The gate reads the agents' PackageStatuses: an
// agent has installed the version when it reports it installed with the
// offered hash; it failed when it reports the install failed, does not
// report within apply_timeout_s, or turns unhealthy. The next wave starts
// when every agent of the current one is done, every one that installed
// the version stayed healthy for bake_s, and at least one did
// (rollout.Spec.Gate). Too many failures pause the rollout or roll it back:
// every agent that was sent the version is offered its previous version
// again.
package upgrades

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/open-telemetry/opamp-go/protobufs"

	"github.com/myriarch/myriarch/internal/fleet/artifacts"
	"github.com/myriarch/myriarch/internal/fleet/jobs"
	"github.com/myriarch/myriarch/internal/fleet/releases"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// States of a package rollout (those of the rollout engine) and of its agents.
const (
	StatePending     = rollout.StatePending
	StateRunning     = rollout.StateRunning
	StatePaused      = rollout.StatePaused
	StateRollingBack = rollout.StateRollingBack
	StateSucceeded   = rollout.StateSucceeded
	StateRolledBack  = rollout.StateRolledBack
	StateAborted     = rollout.StateAborted
	StateFailed      = rollout.StateFailed

	AgentPending    = rollout.AgentPending
	AgentInProgress = rollout.AgentInProgress
	AgentInstalled  = "installed"
	AgentFailed     = rollout.AgentFailed
	AgentSkipped    = rollout.AgentSkipped
	AgentReverted   = "reverted"
)

// Status names of opamp-go's PackageStatusEnum as the OpAMP server stores them.
var (
	statusInstalled     = protobufs.PackageStatusEnum_PackageStatusEnum_Installed.String()
	statusInstallFailed = protobufs.PackageStatusEnum_PackageStatusEnum_InstallFailed.String()
)

// Rollout is one package rollout.
type Rollout struct {
	ID         int64        `json:"id"`
	Package    string       `json:"package"`
	Version    string       `json:"version"`
	Spec       rollout.Spec `json:"spec"`
	State      string       `json:"state"`
	Reason     string       `json:"reason"`
	Wave       int          `json:"wave"`
	Waves      int          `json:"waves"`
	Requested  string       `json:"requested,omitempty"`
	CreatedBy  string       `json:"created_by"`
	CreatedAt  time.Time    `json:"created_at"`
	FinishedAt *time.Time   `json:"finished_at"`
	// Counts are the agents per state.
	Counts map[string]int `json:"agents"`
	// term is the job's term of the step that works on the rollout.
	term int64
}

// Create validates and records a rollout of version of pkg; the engine
// plans it in its next step.
func Create(ctx context.Context, pool *pgxpool.Pool, pkg, version string, spec rollout.Spec, by string) (Rollout, error) {
	spec = spec.WithDefaults()
	if err := spec.Validate(); err != nil {
		return Rollout{}, err
	}
	if spec.Order != rollout.OrderUID {
		// The owner's hold (a standby healthy on the new target first) reads
		// configuration reports; package rollouts do not have it yet.
		return Rollout{}, fmt.Errorf("order %q: package rollouts take order %s only", spec.Order, rollout.OrderUID)
	}
	ok, err := releases.Recorded(ctx, pool, pkg, version)
	if err != nil {
		return Rollout{}, err
	}
	if !ok {
		return Rollout{}, fmt.Errorf("version %q: no release %s %s is recorded", version, pkg, version)
	}
	sj, _ := json.Marshal(spec)
	r := Rollout{Package: pkg, Version: version, Spec: spec, State: StatePending, CreatedBy: by}
	err = pool.QueryRow(ctx, `INSERT INTO package_rollouts (package, version, spec, state, created_by) VALUES ($1, $2, $3, 'pending', $4)
		RETURNING id, created_at`, pkg, version, sj, by).Scan(&r.ID, &r.CreatedAt)
	return r, err
}

// ErrNotFound is returned for an unknown rollout.
var ErrNotFound = errors.New("not found")

// Request stores an operator command for the engine.
func Request(ctx context.Context, pool *pgxpool.Pool, id int64, cmd string) error {
	if !slices.Contains(rollout.Commands, cmd) {
		return fmt.Errorf("command %q: must be pause, resume, rollback or abort", cmd)
	}
	tag, err := pool.Exec(ctx, `UPDATE package_rollouts SET requested = $2, updated_at = now() WHERE id = $1
		AND state = ANY($3)`, id, cmd, rollout.ActiveStates)
	if err == nil && tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: no active package rollout %d", ErrNotFound, id)
	}
	return err
}

// List returns the package rollouts, newest first, with their agent counts.
func List(ctx context.Context, pool *pgxpool.Pool) ([]Rollout, error) {
	rows, err := pool.Query(ctx, `SELECT r.id, r.package, r.version, r.spec, r.state, r.reason, r.wave, r.waves, r.requested, r.created_by, r.created_at, r.finished_at,
			coalesce((SELECT jsonb_object_agg(s, c) FROM (SELECT state s, count(*) c FROM package_rollout_agents WHERE rollout_id = r.id GROUP BY state) x), '{}')
		FROM package_rollouts r ORDER BY r.id DESC`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Rollout, error) {
		var r Rollout
		var sj []byte
		err := row.Scan(&r.ID, &r.Package, &r.Version, &sj, &r.State, &r.Reason, &r.Wave, &r.Waves, &r.Requested, &r.CreatedBy, &r.CreatedAt, &r.FinishedAt, &r.Counts)
		if err == nil {
			err = json.Unmarshal(sj, &r.Spec)
		}
		return r, err
	})
}

// Engine is the leader job: the rollout engine (rollout.RunSteps) with the
// package-version target.
type Engine struct {
	Pool *pgxpool.Pool
	// LockKey is ha.leaderLockKey (the term row of the fence; 0 is
	// pgleader's default).
	LockKey int64
	Log     *slog.Logger
}

// Job returns the leader job.
func (e *Engine) Job(interval time.Duration) jobs.Job {
	return jobs.Job{Name: "package_rollouts", Interval: interval, Run: e.Run}
}

// Run takes every active rollout one step, each in its own transaction of
// the job's term (rollout.RunSteps over the engine's machine with the
// package-version kind).
func (e *Engine) Run(ctx context.Context, fence jobs.Fence) error {
	return rollout.RunSteps(ctx, fence, e.LockKey, rollout.Machine(packageKind{e}))
}

// packageKind is the package-version kind of the rollout engine:
// "applied" is an installed report of the version with the offered hash
// by a healthy agent, pushing is a package offer, rolling back is
// offering every agent that was sent the version its previous one (or
// withdrawing the offer).
type packageKind struct{ e *Engine }

func (packageKind) Kind() string { return "package rollout" }

func (t packageKind) Active(ctx context.Context) ([]int64, error) {
	rows, err := t.e.Pool.Query(ctx, `SELECT id FROM package_rollouts WHERE state = ANY($1) ORDER BY id`, rollout.ActiveStates)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

func (e *Engine) log() *slog.Logger {
	if e.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return e.Log
}

// stepper is one step of one package rollout (rollout.Steps). The table
// numbers waves from 0; the machine from 1.
type stepper struct {
	e  *Engine
	tx pgx.Tx
	r  Rollout
}

func (t packageKind) Begin(ctx context.Context, tx pgx.Tx, term, id int64) (rollout.Steps, rollout.Job, bool, error) {
	var r Rollout
	var sj []byte
	err := tx.QueryRow(ctx, `SELECT package, version, spec, state, reason, wave, waves, requested FROM package_rollouts WHERE id = $1 FOR UPDATE`, id).
		Scan(&r.Package, &r.Version, &sj, &r.State, &r.Reason, &r.Wave, &r.Waves, &r.Requested)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, rollout.Job{}, false, nil
	}
	if err != nil {
		return nil, rollout.Job{}, false, err
	}
	if err := json.Unmarshal(sj, &r.Spec); err != nil {
		return nil, rollout.Job{}, false, err
	}
	r.ID, r.term = id, term
	j := rollout.Job{ID: id, Spec: r.Spec, State: r.State, Requested: r.Requested, Reason: r.Reason, Wave: r.Wave + 1, Waves: r.Waves, Term: term}
	if r.State == StatePending {
		j.Wave = 0
	}
	return &stepper{e: t.e, tx: tx, r: r}, j, true, nil
}

func (s *stepper) What() string { return "the version" }

// RollBackTo: every agent has a version to go back to, or its offer is
// withdrawn.
func (s *stepper) RollBackTo(*rollout.Job) string { return "the previous versions" }

// Save records the job, written in the term of its step.
func (s *stepper) Save(ctx context.Context, before, j rollout.Job) error {
	if before.State == j.State && before.Reason == j.Reason && before.Requested == j.Requested && before.Wave == j.Wave && before.Waves == j.Waves {
		return nil
	}
	if j.State != before.State {
		s.e.log().Info("package rollout state changed", "rollout", j.ID, "package", s.r.Package, "version", s.r.Version,
			"from", before.State, "to", j.State, "reason", j.Reason, "term", j.Term)
	}
	// The table's wave is 0-based while the rollout runs and the number of
	// waves once it succeeded (as the API has always shown it).
	wave := max(j.Wave-1, 0)
	if j.State == StateSucceeded {
		wave = j.Waves
	}
	_, err := s.tx.Exec(ctx, `UPDATE package_rollouts SET state = $2, reason = $3, requested = $4, wave = $5, waves = $6, updated_at = now(), term = $7,
		finished_at = CASE WHEN $2 = ANY($8) THEN NULL ELSE coalesce(finished_at, now()) END WHERE id = $1`,
		j.ID, j.State, j.Reason, j.Requested, wave, j.Waves, j.Term, rollout.ActiveStates)
	return err
}

// Plan selects the agents, orders them by uid and splits them into waves.
// None: the rollout fails (unlike a configuration rollout, which then has
// nothing to do: an empty package rollout is almost always a selector
// that matches no agent accepting packages).
func (s *stepper) Plan(ctx context.Context, j *rollout.Job) error {
	r := s.r
	ags, err := store.PackageAgents(ctx, s.tx, r.Package, r.Spec.Selector, uint64(protobufs.AgentCapabilities_AgentCapabilities_AcceptsPackages))
	if err != nil {
		return err
	}
	if len(ags) == 0 {
		j.State, j.Reason = StateFailed, "no agent that accepts packages matches the selector"
		return nil
	}
	sizes := r.Spec.WaveSizes(len(ags))
	i := 0
	for w, n := range sizes {
		for range n {
			if _, err := s.tx.Exec(ctx, `INSERT INTO package_rollout_agents (rollout_id, instance_uid, wave, previous_version) VALUES ($1, $2, $3, $4)`,
				r.ID, ags[i].UID, w, ags[i].HasVersion); err != nil {
				return err
			}
			i++
		}
	}
	s.e.log().Info("package rollout planned", "rollout", r.ID, "package", r.Package, "version", r.Version, "agents", len(ags), "waves", len(sizes))
	j.Waves, j.Wave, j.State, j.Reason = len(sizes), 1, StateRunning, ""
	return nil
}

type agentRow struct {
	uid, state, offeredHash, prev string
	wave                          int
	sentAt, installedAt           *time.Time
	// From the agent's report.
	online                                   bool
	healthy                                  *bool
	hasVersion, hasHash, status, reportError string
}

func (a agentRow) unhealthy() bool { return a.healthy != nil && !*a.healthy }

func (s *stepper) agents(ctx context.Context) ([]agentRow, error) {
	rows, err := s.tx.Query(ctx, `SELECT instance_uid, state, offered_hash, previous_version, wave, sent_at, installed_at
		FROM package_rollout_agents WHERE rollout_id = $1 ORDER BY wave, instance_uid`, s.r.ID)
	if err != nil {
		return nil, err
	}
	ags, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (agentRow, error) {
		var a agentRow
		return a, row.Scan(&a.uid, &a.state, &a.offeredHash, &a.prev, &a.wave, &a.sentAt, &a.installedAt)
	})
	if err != nil || len(ags) == 0 {
		return ags, err
	}
	uids := make([]string, len(ags))
	for i, a := range ags {
		uids[i] = a.uid
	}
	reps, err := store.PackageReports(ctx, s.tx, uids, s.r.Package)
	if err != nil {
		return nil, err
	}
	for i := range ags {
		rep := reps[ags[i].uid] // none for an agent without a row
		a := &ags[i]
		a.online, a.healthy = rep.Online, rep.Healthy
		a.hasVersion, a.hasHash, a.status, a.reportError = rep.HasVersion, rep.HasHash, rep.Status, rep.Error
	}
	return ags, nil
}

func setAgent(ctx context.Context, tx pgx.Tx, id int64, uid, state, msg string) error {
	_, err := tx.Exec(ctx, `UPDATE package_rollout_agents SET state = $3, error = $4,
		installed_at = CASE WHEN $3 = 'installed' THEN coalesce(installed_at, now()) ELSE installed_at END
		WHERE rollout_id = $1 AND instance_uid = $2`, id, uid, state, msg)
	return err
}

// Observe reads the reports: installed (with the offered hash, healthy),
// install failed, installed but unhealthy, no report within
// apply_timeout_s; an agent of the current wave that turns unhealthy
// during the bake fails.
func (s *stepper) Observe(ctx context.Context, j *rollout.Job) error {
	ags, err := s.agents(ctx)
	if err != nil {
		return err
	}
	r := s.r
	for _, a := range ags {
		state, msg := "", ""
		switch {
		case a.state == AgentInProgress && a.status == statusInstalled && a.hasVersion == r.Version && a.hasHash == a.offeredHash:
			state = AgentInstalled
			if a.unhealthy() {
				state, msg = AgentFailed, "installed but unhealthy"
			}
		case a.state == AgentInProgress && a.status == statusInstallFailed:
			state, msg = AgentFailed, "install failed: "+a.reportError
		case a.state == AgentInProgress && j.Spec.TimedOut(a.sentAt, j.Now):
			state, msg = AgentFailed, fmt.Sprintf("no installed report within apply_timeout_s %.0f", j.Spec.ApplyTimeoutS)
		case a.state == AgentInstalled && a.wave == j.Wave-1 && a.unhealthy():
			state, msg = AgentFailed, "unhealthy after the install"
		}
		if state != "" {
			if err := setAgent(ctx, s.tx, r.ID, a.uid, state, msg); err != nil {
				return err
			}
		}
	}
	return nil
}

// Failures: the failed agents (a resume turns the failures before it into
// skipped ones) of all planned.
func (s *stepper) Failures(ctx context.Context, _ *rollout.Job) (failed, planned int, err error) {
	err = s.tx.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'failed'), count(*) FROM package_rollout_agents WHERE rollout_id = $1`, s.r.ID).
		Scan(&failed, &planned)
	return failed, planned, err
}

// Forgive turns the failures so far into skipped agents that say so
// (package_rollouts has no failed_ack column, unlike rollouts).
func (s *stepper) Forgive(ctx context.Context, _ *rollout.Job) error {
	_, err := s.tx.Exec(ctx, `UPDATE package_rollout_agents SET state = 'skipped', error = 'failed before the resume: ' || error
		WHERE rollout_id = $1 AND state = 'failed'`, s.r.ID)
	return err
}

// Dispatch offers the version to the pending agents of the current wave,
// within max_in_progress.
func (s *stepper) Dispatch(ctx context.Context, j *rollout.Job) error {
	ags, err := s.agents(ctx)
	if err != nil {
		return err
	}
	r := s.r
	inProgress := 0
	for _, a := range ags {
		if a.state == AgentInProgress {
			inProgress++
		}
	}
	for _, a := range ags {
		if a.wave != j.Wave-1 || a.state != AgentPending {
			continue
		}
		if j.Spec.Room(inProgress) <= 0 {
			return nil
		}
		if !a.online {
			if err := setAgent(ctx, s.tx, r.ID, a.uid, AgentSkipped, "offline at its turn"); err != nil {
				return err
			}
			continue
		}
		o, err := artifacts.OfferTx(ctx, s.tx, r.Package, r.Version, a.uid, fmt.Sprintf("package rollout %d", r.ID))
		if err != nil {
			if errors.Is(err, artifacts.ErrNotOfferable) {
				if err := setAgent(ctx, s.tx, r.ID, a.uid, AgentFailed, err.Error()); err != nil {
					return err
				}
				continue
			}
			return err
		}
		if _, err := s.tx.Exec(ctx, `UPDATE package_rollout_agents SET state = 'in_progress', sent_at = now(), offered_hash = $3
			WHERE rollout_id = $1 AND instance_uid = $2`, r.ID, a.uid, hex.EncodeToString(o.PackageHash())); err != nil {
			return err
		}
		inProgress++
	}
	return nil
}

// Tally reads the current wave for the gate.
func (s *stepper) Tally(ctx context.Context, j *rollout.Job) (rollout.WaveTally, error) {
	w := rollout.WaveTally{Wave: j.Wave}
	ags, err := s.agents(ctx)
	for _, a := range ags {
		if a.wave != j.Wave-1 {
			continue
		}
		switch a.state {
		case AgentPending, AgentInProgress:
			w.Open++
		case AgentInstalled:
			if j.Spec.Baked(a.installedAt, j.Now) {
				w.Held++
			} else {
				w.Baking++
			}
		case AgentFailed:
			w.Failed++
		}
	}
	return w, err
}

// WaveDone: package rollouts keep no per-wave times.
func (s *stepper) WaveDone(context.Context, *rollout.Job) error { return nil }

// GatePassed logs the gate.
func (s *stepper) GatePassed(_ context.Context, j *rollout.Job) error {
	s.e.log().Info("package rollout gate passed", "rollout", j.ID, "wave", j.Wave)
	return nil
}

// WaveStarted: package rollouts keep no per-wave times.
func (s *stepper) WaveStarted(context.Context, *rollout.Job) error { return nil }

// Succeed logs the end.
func (s *stepper) Succeed(_ context.Context, j *rollout.Job) error {
	s.e.log().Info("package rollout succeeded", "rollout", j.ID, "package", s.r.Package, "version", s.r.Version)
	return nil
}

// RollBack offers every agent that was sent the version its previous one
// (or withdraws the offer); it is done at once: the offers are the
// rollback (the agents' installs of the previous version are not awaited).
func (s *stepper) RollBack(ctx context.Context, _ *rollout.Job) (bool, error) {
	ags, err := s.agents(ctx)
	if err != nil {
		return false, err
	}
	r := s.r
	for _, a := range ags {
		if a.sentAt == nil || a.state == AgentReverted {
			continue
		}
		msg := "offered the previous version " + a.prev
		if a.prev == "" || a.prev == r.Version {
			// Nothing to go back to: withdraw the offer.
			if err := artifacts.DeleteOffer(ctx, s.tx, a.uid, r.Package); err != nil {
				return false, err
			}
			msg = "offer withdrawn (no previous version)"
		} else if _, err := artifacts.OfferTx(ctx, s.tx, r.Package, a.prev, a.uid, fmt.Sprintf("rollback of package rollout %d", r.ID)); err != nil {
			if !errors.Is(err, artifacts.ErrNotOfferable) {
				return false, err
			}
			msg = "previous version not offerable: " + err.Error()
		}
		if _, err := s.tx.Exec(ctx, `UPDATE package_rollout_agents SET state = 'reverted', error = $3 WHERE rollout_id = $1 AND instance_uid = $2`,
			r.ID, a.uid, msg); err != nil {
			return false, err
		}
	}
	s.e.log().Warn("package rollout rolled back", "rollout", r.ID, "package", r.Package, "version", r.Version)
	return true, nil
}
