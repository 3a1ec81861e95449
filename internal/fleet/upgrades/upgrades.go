// Package upgrades runs upgrades of agent software as rollouts: a leader
// job takes a package version to the agents that match a selector, wave by
// wave, with the Spec of configuration rollouts (package rollout): waves,
// max_in_progress, bake_s, apply_timeout_s, failure_policy, max_failed.
//
// The job is the rollout engine of package rollout (rollout.RunSteps) with
// a package-version target: each step of a rollout is one transaction of
// the job's own term, which the rollout row records. Sending an agent
// the version is an offer (package artifacts: OpAMP PackagesAvailable with
// the download URL, content hash and signature) recorded with the package
// hash it must report. The gate reads the agents' PackageStatuses: an
// agent has installed the version when it reports it installed with the
// offered hash; it failed when it reports the install failed, does not
// report within apply_timeout_s, or turns unhealthy. The next wave starts
// when every agent of the current one installed the version and stayed
// healthy for bake_s. Too many failures pause the rollout or roll it back:
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
// the job's term (rollout.RunSteps).
func (e *Engine) Run(ctx context.Context, fence jobs.Fence) error {
	return rollout.RunSteps(ctx, fence, e.LockKey, packageTarget{e})
}

// packageTarget is the package-version target of the rollout engine.
type packageTarget struct{ e *Engine }

func (packageTarget) Kind() string { return "package rollout" }

func (t packageTarget) Active(ctx context.Context) ([]int64, error) {
	rows, err := t.e.Pool.Query(ctx, `SELECT id FROM package_rollouts WHERE state = ANY($1) ORDER BY id`, rollout.ActiveStates)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

func (t packageTarget) Step(ctx context.Context, tx pgx.Tx, term, id int64) error {
	return t.e.step(ctx, tx, term, id)
}

func (e *Engine) log() *slog.Logger {
	if e.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return e.Log
}

// setState records the state of rollout r, written in the term of its step.
func setState(ctx context.Context, tx pgx.Tx, r Rollout, state, reason string) error {
	_, err := tx.Exec(ctx, `UPDATE package_rollouts SET state = $2, reason = $3, requested = '', updated_at = now(), term = $4,
		finished_at = CASE WHEN $2 IN ('succeeded', 'rolled_back', 'aborted', 'failed') THEN now() END WHERE id = $1`, r.ID, state, reason, r.term)
	return err
}

func (e *Engine) step(ctx context.Context, tx pgx.Tx, term, id int64) error {
	var r Rollout
	var sj []byte
	if err := tx.QueryRow(ctx, `SELECT package, version, spec, state, wave, waves, requested FROM package_rollouts WHERE id = $1 FOR UPDATE`, id).
		Scan(&r.Package, &r.Version, &sj, &r.State, &r.Wave, &r.Waves, &r.Requested); err != nil {
		return err
	}
	if err := json.Unmarshal(sj, &r.Spec); err != nil {
		return err
	}
	r.ID, r.term = id, term
	switch r.Requested {
	case rollout.CmdAbort:
		return setState(ctx, tx, r, StateAborted, "aborted by the operator")
	case rollout.CmdRollback:
		r.State = StateRollingBack
		if err := setState(ctx, tx, r, StateRollingBack, "rollback requested by the operator"); err != nil {
			return err
		}
	case rollout.CmdPause:
		if r.State == StateRunning {
			return setState(ctx, tx, r, StatePaused, "paused by the operator")
		}
	case rollout.CmdResume:
		if r.State == StatePaused {
			// Failures so far are forgiven: they count from the resume.
			if _, err := tx.Exec(ctx, `UPDATE package_rollout_agents SET state = 'skipped', error = 'failed before the resume: ' || error
				WHERE rollout_id = $1 AND state = 'failed'`, id); err != nil {
				return err
			}
			r.State = StateRunning
			if err := setState(ctx, tx, r, StateRunning, ""); err != nil {
				return err
			}
		}
	}
	switch r.State {
	case StatePending:
		return e.plan(ctx, tx, r)
	case StateRunning:
		return e.advance(ctx, tx, r)
	case StateRollingBack:
		return e.rollBack(ctx, tx, r)
	}
	return nil
}

// plan selects the agents, orders them by uid and splits them into waves.
func (e *Engine) plan(ctx context.Context, tx pgx.Tx, r Rollout) error {
	ags, err := store.PackageAgents(ctx, tx, r.Package, r.Spec.Selector, uint64(protobufs.AgentCapabilities_AgentCapabilities_AcceptsPackages))
	if err != nil {
		return err
	}
	if len(ags) == 0 {
		return setState(ctx, tx, r, StateFailed, "no agent that accepts packages matches the selector")
	}
	sizes := r.Spec.WaveSizes(len(ags))
	i := 0
	for w, n := range sizes {
		for range n {
			if _, err := tx.Exec(ctx, `INSERT INTO package_rollout_agents (rollout_id, instance_uid, wave, previous_version) VALUES ($1, $2, $3, $4)`,
				r.ID, ags[i].UID, w, ags[i].HasVersion); err != nil {
				return err
			}
			i++
		}
	}
	e.log().Info("package rollout planned", "rollout", r.ID, "package", r.Package, "version", r.Version, "agents", len(ags), "waves", len(sizes))
	_, err = tx.Exec(ctx, `UPDATE package_rollouts SET state = 'running', wave = 0, waves = $2, updated_at = now(), term = $3 WHERE id = $1`, r.ID, len(sizes), r.term)
	return err
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

func (e *Engine) agents(ctx context.Context, tx pgx.Tx, r Rollout) ([]agentRow, error) {
	rows, err := tx.Query(ctx, `SELECT instance_uid, state, offered_hash, previous_version, wave, sent_at, installed_at
		FROM package_rollout_agents WHERE rollout_id = $1 ORDER BY wave, instance_uid`, r.ID)
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
	reps, err := store.PackageReports(ctx, tx, uids, r.Package)
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

// advance reads the reports, applies the failure policy, sends the
// current wave and opens the next one when the gate passes.
func (e *Engine) advance(ctx context.Context, tx pgx.Tx, r Rollout) error {
	ags, err := e.agents(ctx, tx, r)
	if err != nil {
		return err
	}
	now := time.Now()
	failed, inProgress := 0, 0
	for i := range ags {
		a := &ags[i]
		switch a.state {
		case AgentInProgress:
			switch {
			case a.status == statusInstalled && a.hasVersion == r.Version && a.hasHash == a.offeredHash:
				a.state = AgentInstalled
				t := now
				a.installedAt = &t
				if err := setAgent(ctx, tx, r.ID, a.uid, AgentInstalled, ""); err != nil {
					return err
				}
			case a.status == statusInstallFailed:
				a.state = AgentFailed
				if err := setAgent(ctx, tx, r.ID, a.uid, AgentFailed, "install failed: "+a.reportError); err != nil {
					return err
				}
			case r.Spec.TimedOut(a.sentAt, now):
				a.state = AgentFailed
				if err := setAgent(ctx, tx, r.ID, a.uid, AgentFailed, fmt.Sprintf("no installed report within apply_timeout_s %.0f", r.Spec.ApplyTimeoutS)); err != nil {
					return err
				}
			}
		case AgentInstalled:
			if a.healthy != nil && !*a.healthy {
				a.state = AgentFailed
				if err := setAgent(ctx, tx, r.ID, a.uid, AgentFailed, "unhealthy after the install"); err != nil {
					return err
				}
			}
		}
		switch a.state {
		case AgentFailed:
			failed++
		case AgentInProgress:
			inProgress++
		}
	}
	if r.Spec.TooManyFailed(failed, len(ags)) {
		reason := fmt.Sprintf("%d agents failed (max_failed %d, max_failed_percent %g)", failed, r.Spec.MaxFailed, r.Spec.MaxFailedPercent)
		e.log().Warn("package rollout failed its gate", "rollout", r.ID, "reason", reason, "policy", r.Spec.FailurePolicy)
		// Every agent has a version to go back to (or its offer is withdrawn).
		return setState(ctx, tx, r, r.Spec.FailureState(true), reason)
	}
	// Send the pending agents of the current wave.
	w := rollout.WaveTally{Wave: r.Wave + 1}
	for _, a := range ags {
		if a.wave != r.Wave {
			continue
		}
		switch a.state {
		case AgentPending:
			w.Open++
			if r.Spec.Room(inProgress) <= 0 {
				continue
			}
			if !a.online {
				if err := setAgent(ctx, tx, r.ID, a.uid, AgentSkipped, "offline at its turn"); err != nil {
					return err
				}
				continue
			}
			o, err := artifacts.OfferTx(ctx, tx, r.Package, r.Version, a.uid, fmt.Sprintf("package rollout %d", r.ID))
			if err != nil {
				if errors.Is(err, artifacts.ErrNotOfferable) {
					if err := setAgent(ctx, tx, r.ID, a.uid, AgentFailed, err.Error()); err != nil {
						return err
					}
					w.Failed++
					continue
				}
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE package_rollout_agents SET state = 'in_progress', sent_at = now(), offered_hash = $3
				WHERE rollout_id = $1 AND instance_uid = $2`, r.ID, a.uid, hex.EncodeToString(o.PackageHash())); err != nil {
				return err
			}
			inProgress++
		case AgentInProgress:
			w.Open++
		case AgentInstalled:
			if r.Spec.Baked(a.installedAt, now) {
				w.Held++
			} else {
				w.Baking++
			}
		case AgentFailed:
			w.Failed++
		}
	}
	switch v, why := r.Spec.Gate(w, "the version"); v {
	case rollout.GateWait:
		return nil
	case rollout.GateFail:
		e.log().Warn("package rollout failed its gate", "rollout", r.ID, "reason", why, "policy", r.Spec.FailurePolicy)
		return setState(ctx, tx, r, r.Spec.FailureState(true), why)
	}
	next := r.Wave + 1
	if next >= r.Waves {
		e.log().Info("package rollout succeeded", "rollout", r.ID, "package", r.Package, "version", r.Version)
		if _, err := tx.Exec(ctx, `UPDATE package_rollouts SET wave = $2, term = $3 WHERE id = $1`, r.ID, next, r.term); err != nil {
			return err
		}
		return setState(ctx, tx, r, StateSucceeded, "")
	}
	e.log().Info("package rollout gate passed", "rollout", r.ID, "wave", r.Wave, "next", next)
	_, err = tx.Exec(ctx, `UPDATE package_rollouts SET wave = $2, updated_at = now(), term = $3 WHERE id = $1`, r.ID, next, r.term)
	return err
}

// rollBack offers every agent that was sent the version its previous one.
func (e *Engine) rollBack(ctx context.Context, tx pgx.Tx, r Rollout) error {
	ags, err := e.agents(ctx, tx, r)
	if err != nil {
		return err
	}
	for _, a := range ags {
		if a.sentAt == nil || a.state == AgentReverted {
			continue
		}
		msg := "offered the previous version " + a.prev
		if a.prev == "" || a.prev == r.Version {
			// Nothing to go back to: withdraw the offer.
			if err := artifacts.DeleteOffer(ctx, tx, a.uid, r.Package); err != nil {
				return err
			}
			msg = "offer withdrawn (no previous version)"
		} else if _, err := artifacts.OfferTx(ctx, tx, r.Package, a.prev, a.uid, fmt.Sprintf("rollback of package rollout %d", r.ID)); err != nil {
			if !errors.Is(err, artifacts.ErrNotOfferable) {
				return err
			}
			msg = "previous version not offerable: " + err.Error()
		}
		if _, err := tx.Exec(ctx, `UPDATE package_rollout_agents SET state = 'reverted', error = $3 WHERE rollout_id = $1 AND instance_uid = $2`,
			r.ID, a.uid, msg); err != nil {
			return err
		}
	}
	e.log().Warn("package rollout rolled back", "rollout", r.ID, "package", r.Package, "version", r.Version)
	var reason string
	if err := tx.QueryRow(ctx, `SELECT reason FROM package_rollouts WHERE id = $1`, r.ID).Scan(&reason); err != nil {
		return err
	}
	return setState(ctx, tx, r, StateRolledBack, reason)
}
