// Package rollout is myriarchd's rollout planner and engine: it takes one
// configuration from revision A to revision B across the agents assigned
// to it, wave by wave, behind a health gate.
//
// A rollout is created (API, UI, CLI, or GitOps for a configuration that
// asks for it) in state pending. The engine is a leader job (jobs.Job);
// each pass takes every active rollout one step in its own term-fenced
// transaction (RunSteps over Machine, InTerm; engine.go and machine.go
// hold what package rollouts, package upgrades, share with configuration
// rollouts; this file is the configuration-revision kind):
//
//   - pending: the planner selects the agents assigned to the configuration
//     (selector and precedence, package configs), refuses the rollout when
//     one of them belongs to another active rollout, orders them (by
//     instance uid, or standbys-first: OrderAgents) and splits them into
//     the waves of the Spec.
//   - running: reports are read (APPLIED with the new hash, FAILED, health),
//     an agent that sees no report within apply_timeout fails, the failure
//     policy is applied (pause, or roll back to A), and agents of the
//     current wave are sent the revision, at most max_in_progress at a time;
//     an agent that is offline at its turn is skipped and reported (with
//     order standbys-first a bridge owner waits for a standby of its bridge
//     healthy on the revision). The gate (Spec.Gate) opens the next wave
//     when no agent of the current one is pending or in progress, every
//     agent that applied has been healthy for bake_s, and at least one did.
//   - rolling_back: every agent that was sent B is sent A.
//
// After the rollouts, the pass gives every online agent without any
// desired config the current revision of its configuration (an assign
// intent), unless that configuration has an active rollout.
//
// Operator commands (pause, resume, abort, rollback) are requests stored
// on the rollout; the engine carries them out in its next fenced step, so
// every state change of a rollout is a write of the current term.
//
// "Sending" an agent a revision is a write of its desired config (the one
// the OpAMP server of the replica the agent is connected to delivers, after
// the NOTIFY of the same transaction), preceded in that transaction by an
// intent row (rollout_intents) with the term. A leader that lost its term
// cannot commit either, so nothing reaches an agent from an old term after
// a new one began. A new leader continues from the rows: agents in
// progress are not sent again, the current wave is finished before the
// next one starts, and no wave is skipped.
package rollout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/myriarch/myriarch/internal/fleet/jobs"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/pgleader"
)

// Rollout states.
const (
	StatePending     = "pending"
	StateRunning     = "running"
	StatePaused      = "paused"
	StateRollingBack = "rolling_back"
	StateSucceeded   = "succeeded"
	StateAborted     = "aborted"
	StateRolledBack  = "rolled_back"
	StateFailed      = "failed"
)

// ActiveStates are the states in which the engine works on a rollout.
var ActiveStates = []string{StatePending, StateRunning, StatePaused, StateRollingBack}

// Agent states within a rollout (the state label of myriarch_rollout_agents).
const (
	AgentPending    = "pending"
	AgentInProgress = "in_progress"
	AgentApplied    = "applied"
	AgentFailed     = "failed"
	AgentSkipped    = "skipped"
)

// AgentStates lists them in display order.
var AgentStates = []string{AgentPending, AgentInProgress, AgentApplied, AgentFailed, AgentSkipped}

// Operator commands.
const (
	CmdPause    = "pause"
	CmdResume   = "resume"
	CmdAbort    = "abort"
	CmdRollback = "rollback"
)

// JobName is the name of the engine's leader job.
const JobName = "rollout_engine"

// Rollout is one rollout as stored.
type Rollout struct {
	ID           int64  `json:"id"`
	Config       string `json:"config"`
	FromRevision int    `json:"from_revision"`
	ToRevision   int    `json:"to_revision"`
	Spec         Spec   `json:"spec"`
	State        string `json:"state"`
	// Requested is an operator command not carried out yet.
	Requested string `json:"requested"`
	// Wave is the current wave, 1-based (0 before planning); Waves the number.
	Wave           int       `json:"wave"`
	Waves          int       `json:"waves"`
	FailedAck      int       `json:"failed_acknowledged"`
	Reason         string    `json:"reason"`
	CreatedBy      string    `json:"created_by"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
	LastProgressAt time.Time `json:"last_progress_at"`
	// PlanStartedAt and PlannedAt bracket the planner's work.
	PlanStartedAt *time.Time `json:"plan_started_at"`
	PlannedAt     *time.Time `json:"planned_at"`
	FinishedAt    *time.Time `json:"finished_at"`
	Term          int64      `json:"term"`
}

const rolloutCols = `id, config, from_revision, to_revision, spec, state, requested, wave, waves, failed_ack, reason, created_by,
	created_at, updated_at, last_progress_at, plan_started_at, planned_at, finished_at, term`

func scanRollout(row pgx.Row) (Rollout, error) {
	var r Rollout
	var spec []byte
	err := row.Scan(&r.ID, &r.Config, &r.FromRevision, &r.ToRevision, &spec, &r.State, &r.Requested, &r.Wave, &r.Waves, &r.FailedAck,
		&r.Reason, &r.CreatedBy, &r.CreatedAt, &r.UpdatedAt, &r.LastProgressAt, &r.PlanStartedAt, &r.PlannedAt, &r.FinishedAt, &r.Term)
	if err != nil {
		return r, err
	}
	err = json.Unmarshal(spec, &r.Spec)
	return r, err
}

// Active reports whether the engine still works on the rollout.
func (r Rollout) Active() bool { return slices.Contains(ActiveStates, r.State) }

// Engine runs rollouts. It is a leader job: see Job.
type Engine struct {
	Store *store.Store
	// LockKey is ha.leaderLockKey (the term row to read).
	LockKey int64
	Log     *slog.Logger
}

// Job is the engine as a leader job that runs every interval.
func (e *Engine) Job(interval time.Duration) jobs.Job {
	return jobs.Job{Name: JobName, Interval: interval, Run: e.Run}
}

// Run takes every active rollout one step, each in its own fenced
// transaction (RunSteps over the machine with the configuration-revision
// kind), then gives new agents their configuration.
func (e *Engine) Run(ctx context.Context, fence jobs.Fence) error {
	err := RunSteps(ctx, fence, e.LockKey, Machine(configKind{e}))
	if errors.Is(err, pgleader.ErrStaleTerm) || ctx.Err() != nil {
		return err
	}
	errs := []error{err}
	err = InTerm(ctx, fence, e.LockKey, func(ctx context.Context, tx pgx.Tx, term int64) error {
		return e.assign(ctx, tx, term)
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("assigning current revisions: %w", err))
	}
	return errors.Join(errs...)
}

// configKind is the configuration-revision kind of the engine: "applied"
// is an APPLIED report of the revision's hash by a healthy agent, pushing
// is a write of the agent's desired config (with an intent row of the
// term), rolling back is pushing the from revision and waiting for its
// reports.
type configKind struct{ e *Engine }

func (configKind) Kind() string { return "rollout" }

func (t configKind) Active(ctx context.Context) ([]int64, error) {
	rows, err := t.e.Store.Pool.Query(ctx, `SELECT id FROM rollouts WHERE state = ANY($1) ORDER BY id`, ActiveStates)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// assignBatch bounds the agents given their configuration in one pass.
const assignBatch = 1000

// assign gives every online agent that has no desired config at all (a new
// agent) the current revision of the configuration assigned to it, unless
// that configuration has an active rollout (the rollout's planner decides
// then). Agents with a desired config, from a rollout or set directly,
// change only through rollouts.
func (e *Engine) assign(ctx context.Context, tx pgx.Tx, term int64) error {
	rows, err := tx.Query(ctx, `SELECT DISTINCT config FROM rollouts WHERE state = ANY($1)`, ActiveStates)
	if err != nil {
		return err
	}
	busy, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	news, err := store.NewAgents(ctx, tx, busy, assignBatch)
	if err != nil {
		return err
	}
	type key struct {
		config string
		rev    int
	}
	groups := map[key][]string{}
	for _, a := range news {
		groups[key{a.Config, a.Revision}] = append(groups[key{a.Config, a.Revision}], a.UID)
	}
	for k, uids := range groups {
		r, err := store.GetRevision(ctx, tx, k.config, k.rev)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO rollout_intents (rollout_id, instance_uid, config, wave, term, kind, revision, hash)
			SELECT NULL, u, $2, 0, $3, 'assign', $4, $5 FROM unnest($1::text[]) AS u`, uids, k.config, term, r.Revision, r.Hash); err != nil {
			return err
		}
		if err := store.SetDesiredRevision(ctx, tx, uids, k.config, r); err != nil {
			return err
		}
		e.log().Info("gave new agents the current revision of their configuration", "config", k.config, "revision", r.Revision, "agents", len(uids))
	}
	return nil
}

// stepper is one fenced step of one configuration rollout (Steps).
type stepper struct {
	e        *Engine
	tx       pgx.Tx
	term     int64
	r        *Rollout
	progress bool
	to, from store.Revision
}

func (t configKind) Begin(ctx context.Context, tx pgx.Tx, term, id int64) (Steps, Job, bool, error) {
	r, err := scanRollout(tx.QueryRow(ctx, "SELECT "+rolloutCols+" FROM rollouts WHERE id = $1 FOR UPDATE", id))
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !r.Active()) {
		return nil, Job{}, false, nil
	}
	if err != nil {
		return nil, Job{}, false, err
	}
	s := &stepper{e: t.e, tx: tx, term: term, r: &r}
	if s.to, err = store.GetRevision(ctx, tx, r.Config, r.ToRevision); err != nil {
		return nil, Job{}, false, fmt.Errorf("revision %d of %s: %w", r.ToRevision, r.Config, err)
	}
	if r.FromRevision > 0 {
		if s.from, err = store.GetRevision(ctx, tx, r.Config, r.FromRevision); err != nil {
			return nil, Job{}, false, fmt.Errorf("revision %d of %s: %w", r.FromRevision, r.Config, err)
		}
	}
	return s, Job{ID: r.ID, Spec: r.Spec, State: r.State, Requested: r.Requested, Reason: r.Reason, Wave: r.Wave, Waves: r.Waves, Term: term}, true, nil
}

func (s *stepper) What() string { return "the revision" }

func (s *stepper) RollBackTo(*Job) string {
	if s.r.FromRevision == 0 {
		return ""
	}
	return fmt.Sprintf("revision %d", s.r.FromRevision)
}

// Save writes the rollout when the step made progress (an agent, a wave,
// its state or a command), with the term.
func (s *stepper) Save(ctx context.Context, before, j Job) error {
	r := s.r
	if j.State != before.State || j.Wave != before.Wave || j.Requested != before.Requested || j.Waves != before.Waves {
		s.progress = true
		if j.State != before.State {
			s.e.log().Info("rollout state changed", "rollout", r.ID, "config", r.Config, "from", before.State, "to", j.State,
				"reason", j.Reason, "term", s.term)
		}
	}
	if !s.progress {
		return nil
	}
	_, err := s.tx.Exec(ctx, `UPDATE rollouts SET state = $2, requested = $3, wave = $4, waves = $5, failed_ack = $6, reason = $7,
		updated_at = now(), last_progress_at = now(), term = $8,
		finished_at = CASE WHEN $2 = ANY($9) THEN finished_at ELSE coalesce(finished_at, now()) END
		WHERE id = $1`, r.ID, j.State, j.Requested, j.Wave, j.Waves, r.FailedAck, j.Reason, s.term, ActiveStates)
	return err
}

func (e *Engine) log() *slog.Logger {
	if e.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return e.Log
}

// Forgive acknowledges the failures so far: they stay failed and visible,
// and count no more (failed_ack).
func (s *stepper) Forgive(ctx context.Context, _ *Job) error {
	failed, _, err := s.failedCount(ctx)
	s.r.FailedAck = failed
	s.progress = true
	return err
}

// Failures are the failures since the last resume.
func (s *stepper) Failures(ctx context.Context, _ *Job) (int, int, error) {
	failed, planned, err := s.failedCount(ctx)
	return failed - s.r.FailedAck, planned, err
}

// Selector is the effective selector of a rollout of configuration c.
func Selector(c store.ConfigDef, sp Spec) map[string]string {
	sel := maps.Clone(c.Selector)
	if sel == nil {
		sel = map[string]string{}
	}
	maps.Copy(sel, sp.Selector)
	return sel
}

// Plan selects and orders the agents (the spec's order) and splits them
// into waves.
func (s *stepper) Plan(ctx context.Context, j *Job) error {
	r := s.r
	var planStart time.Time
	if err := s.tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&planStart); err != nil {
		return err
	}
	c, err := store.GetConfig(ctx, s.tx, r.Config)
	if err != nil {
		return err
	}
	if c.DeletedAt != nil {
		j.State, j.Reason = StateFailed, "the configuration was deleted before the rollout was planned"
		return nil
	}
	uids, err := store.AgentsAssigned(ctx, s.tx, Selector(c, r.Spec), r.Config)
	if err != nil {
		return err
	}
	var other int64
	var n int
	err = s.tx.QueryRow(ctx, `SELECT ra.rollout_id, count(*) FROM rollout_agents ra JOIN rollouts o ON o.id = ra.rollout_id
		WHERE o.state = ANY($1) AND o.id <> $2 AND ra.instance_uid = ANY($3) GROUP BY 1 ORDER BY 1 LIMIT 1`, ActiveStates, r.ID, uids).Scan(&other, &n)
	if err == nil {
		j.State, j.Reason = StateFailed, fmt.Sprintf("refused: %d of its agents belong to active rollout %d (overlapping rollouts are refused)", n, other)
		return nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	if len(uids) == 0 {
		j.State, j.Reason = StateSucceeded, "no agent is assigned to the configuration; nothing to do"
		return store.SetCurrentRevision(ctx, s.tx, r.Config, r.ToRevision)
	}
	if uids, err = OrderAgents(ctx, s.tx, uids, r.Spec.Order); err != nil {
		return err
	}
	sizes := r.Spec.WaveSizes(len(uids))
	wave, left := 1, sizes[0]
	_, err = s.tx.CopyFrom(ctx, pgx.Identifier{"rollout_agents"}, []string{"rollout_id", "instance_uid", "wave", "seq", "state"},
		pgx.CopyFromSlice(len(uids), func(i int) ([]any, error) {
			if left == 0 {
				wave++
				left = sizes[wave-1]
			}
			left--
			return []any{r.ID, uids[i], wave, i + 1, AgentPending}, nil
		}))
	if err != nil {
		return err
	}
	waves := make([]int, len(sizes))
	for i := range sizes {
		waves[i] = i + 1
	}
	if _, err := s.tx.Exec(ctx, `INSERT INTO rollout_waves (rollout_id, wave, size, started_at)
		SELECT $1, w, sz, CASE WHEN w = 1 THEN now() END FROM unnest($2::int[], $3::int[]) AS v(w, sz)`, r.ID, waves, sizes); err != nil {
		return err
	}
	j.Waves, j.Wave, j.State, j.Reason = len(sizes), 1, StateRunning, ""
	if _, err := s.tx.Exec(ctx, `UPDATE rollouts SET plan_started_at = $2, planned_at = clock_timestamp() WHERE id = $1`, r.ID, planStart); err != nil {
		return err
	}
	s.e.log().Info("rollout planned", "rollout", r.ID, "config", r.Config, "agents", len(uids), "waves", sizes, "order", r.Spec.Order)
	return nil
}

func (s *stepper) exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := s.tx.Exec(ctx, sql, args...)
	if tag.RowsAffected() > 0 {
		s.progress = true
	}
	return tag.RowsAffected(), err
}

func (s *stepper) failedCount(ctx context.Context) (failed, planned int, err error) {
	err = s.tx.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'failed'), count(*) FROM rollout_agents WHERE rollout_id = $1`, s.r.ID).
		Scan(&failed, &planned)
	return failed, planned, err
}

// agentReports returns the uids that query selects from the rollout's
// agents, in its order, with what those agents last reported
// (store.ConfigReports; an agent without a row has none).
func (s *stepper) agentReports(ctx context.Context, query string, args ...any) ([]string, map[string]store.ConfigReport, error) {
	rows, err := s.tx.Query(ctx, query, args...)
	if err != nil {
		return nil, nil, err
	}
	uids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(uids) == 0 {
		return nil, nil, err
	}
	reps, err := store.ConfigReports(ctx, s.tx, uids)
	return uids, reps, err
}

// reported reports whether rep is an APPLIED or FAILED report of the
// config with hash.
func reported(rep store.ConfigReport, ok bool, hash string) bool {
	return ok && rep.ConfigHash == hash && (rep.ConfigStatus == "applied" || rep.ConfigStatus == "failed")
}

// Observe reads the agents' reports into the rollout.
func (s *stepper) Observe(ctx context.Context, j *Job) error {
	r := s.r
	sent, reps, err := s.agentReports(ctx, `SELECT instance_uid FROM rollout_agents WHERE rollout_id = $1 AND state = 'in_progress'`, r.ID)
	if err != nil {
		return err
	}
	var uids, states, details []string
	for _, uid := range sent {
		a, ok := reps[uid]
		if !reported(a, ok, s.to.Hash) {
			continue
		}
		state, detail := AgentFailed, ""
		switch {
		case a.ConfigStatus == "failed":
			detail = "FAILED: " + a.ConfigError
		case a.Unhealthy():
			detail = "APPLIED but unhealthy: " + a.LastError
		default:
			state = AgentApplied
		}
		uids, states, details = append(uids, uid), append(states, state), append(details, detail)
	}
	if len(uids) > 0 {
		if _, err := s.exec(ctx, `UPDATE rollout_agents ra SET state = v.state, reported_at = now(),
				healthy_since = CASE WHEN v.state = 'applied' THEN now() END, detail = v.detail
			FROM unnest($2::text[], $3::text[], $4::text[]) AS v(uid, state, detail)
			WHERE ra.rollout_id = $1 AND ra.state = 'in_progress' AND ra.instance_uid = v.uid`, r.ID, uids, states, details); err != nil {
			return err
		}
	}
	if _, err := s.exec(ctx, `UPDATE rollout_agents SET state = 'failed', reported_at = now(),
			detail = 'no APPLIED or FAILED report within apply_timeout_s (' || $2::text || ' s)'
		WHERE rollout_id = $1 AND state = 'in_progress' AND sent_at < now() - make_interval(secs => $2)`, r.ID, j.Spec.ApplyTimeoutS); err != nil {
		return err
	}
	// The bake: an agent of the current wave that turns unhealthy fails.
	applied, reps, err := s.agentReports(ctx, `SELECT instance_uid FROM rollout_agents WHERE rollout_id = $1 AND wave = $2 AND state = 'applied'`,
		r.ID, j.Wave)
	if err != nil {
		return err
	}
	uids, details = nil, nil
	for _, uid := range applied {
		if a := reps[uid]; a.Unhealthy() {
			uids, details = append(uids, uid), append(details, "unhealthy after applying: "+a.LastError)
		}
	}
	if len(uids) == 0 {
		return nil
	}
	_, err = s.exec(ctx, `UPDATE rollout_agents ra SET state = 'failed', healthy_since = NULL, detail = v.detail
		FROM unnest($3::text[], $4::text[]) AS v(uid, detail)
		WHERE ra.rollout_id = $1 AND ra.wave = $2 AND ra.state = 'applied' AND ra.instance_uid = v.uid`,
		r.ID, j.Wave, uids, details)
	return err
}

// Dispatch sends the revision to the next agents of the current wave.
func (s *stepper) Dispatch(ctx context.Context, j *Job) error {
	r := s.r
	var inProgress int
	if err := s.tx.QueryRow(ctx, `SELECT count(*) FROM rollout_agents WHERE rollout_id = $1 AND state = 'in_progress'`, r.ID).Scan(&inProgress); err != nil {
		return err
	}
	room := j.Spec.Room(inProgress)
	held := []string{}
	for room > 0 {
		next, reps, err := s.agentReports(ctx, `SELECT instance_uid FROM rollout_agents
			WHERE rollout_id = $1 AND wave = $2 AND state = 'pending' AND NOT instance_uid = ANY($4) ORDER BY seq LIMIT $3`, r.ID, j.Wave, room, held)
		if err != nil {
			return err
		}
		if len(next) == 0 {
			return nil
		}
		var online, offline []string
		for _, uid := range next {
			if reps[uid].Online {
				online = append(online, uid)
			} else {
				offline = append(offline, uid)
			}
		}
		if len(offline) > 0 {
			if _, err := s.exec(ctx, `UPDATE rollout_agents SET state = 'skipped', reported_at = now(), detail = 'offline at its turn'
				WHERE rollout_id = $1 AND instance_uid = ANY($2)`, r.ID, offline); err != nil {
				return err
			}
		}
		if j.Spec.Order == OrderStandbysFirst && len(online) > 0 {
			var wait []string
			if online, wait, err = s.ownersGate(ctx, online); err != nil {
				return err
			}
			held = append(held, wait...)
		}
		if len(online) > 0 {
			if err := s.send(ctx, "apply", j.Wave, s.to, online); err != nil {
				return err
			}
			if _, err := s.exec(ctx, `UPDATE rollout_agents SET state = 'in_progress', sent_at = now()
				WHERE rollout_id = $1 AND instance_uid = ANY($2)`, r.ID, online); err != nil {
				return err
			}
		}
		room -= len(online)
	}
	return nil
}

// ownersGate holds back the bridge owners among uids (order
// standbys-first): an agent that owns a session of bridge B is sent the
// revision only once another agent of B in this rollout has applied it
// and is healthy, so that the owner's restart hands its sessions to a
// standby that already runs the new revision (the planned-stop fast
// path). While such a standby is still pending or in progress the owner
// waits (held); when every standby of B in the rollout is done and none
// applied, the owner fails ("no standby ... healthy on the revision"),
// which the failure rule and the gate then judge. An owner without a
// standby in the rollout is sent at its turn.
func (s *stepper) ownersGate(ctx context.Context, uids []string) (send, held []string, err error) {
	roles, err := store.AgentBridgeRoles(ctx, s.tx, uids)
	if err != nil {
		return nil, nil, err
	}
	var failed, details []string
	for _, uid := range uids {
		br := roles[uid]
		if br.BridgeID == "" || !br.Owner() {
			send = append(send, uid)
			continue
		}
		members, err := store.BridgeMembers(ctx, s.tx, br.BridgeID)
		if err != nil {
			return nil, nil, err
		}
		members = slices.DeleteFunc(members, func(m string) bool { return m == uid })
		rows, err := s.tx.Query(ctx, `SELECT instance_uid, state FROM rollout_agents WHERE rollout_id = $1 AND instance_uid = ANY($2)`, s.r.ID, members)
		if err != nil {
			return nil, nil, err
		}
		peers := map[string]string{}
		var peer, state string
		if _, err := pgx.ForEachRow(rows, []any{&peer, &state}, func() error { peers[peer] = state; return nil }); err != nil {
			return nil, nil, err
		}
		reps, err := store.ConfigReports(ctx, s.tx, slices.Collect(maps.Keys(peers)))
		if err != nil {
			return nil, nil, err
		}
		var ready, waiting int
		standbys := len(peers)
		for p, st := range peers {
			switch {
			case st == AgentApplied && reps[p].Online && !reps[p].Unhealthy():
				ready++
			case st == AgentPending || st == AgentInProgress:
				waiting++
			}
		}
		switch {
		case ready > 0 || standbys == 0:
			send = append(send, uid)
		case waiting > 0:
			held = append(held, uid)
		default:
			failed = append(failed, uid)
			details = append(details, fmt.Sprintf("not sent: no standby of bridge %s is healthy on the revision (order standbys-first)", br.BridgeID))
		}
	}
	if len(failed) > 0 {
		_, err = s.exec(ctx, `UPDATE rollout_agents ra SET state = 'failed', reported_at = now(), detail = v.detail
			FROM unnest($2::text[], $3::text[]) AS v(uid, detail) WHERE ra.rollout_id = $1 AND ra.instance_uid = v.uid`, s.r.ID, failed, details)
	}
	return send, held, err
}

// send records the intents and sets the desired config of uids to rev, in
// the fenced transaction; the commit's NOTIFY makes the replicas deliver.
func (s *stepper) send(ctx context.Context, kind string, wave int, rev store.Revision, uids []string) error {
	r := s.r
	if _, err := s.exec(ctx, `INSERT INTO rollout_intents (rollout_id, instance_uid, config, wave, term, kind, revision, hash)
		SELECT $1, u, $8, $3, $4, $5, $6, $7 FROM unnest($2::text[]) AS u`, r.ID, uids, wave, s.term, kind, rev.Revision, rev.Hash, r.Config); err != nil {
		return err
	}
	return store.SetDesiredRevisionBy(ctx, s.tx, uids, r.Config, rev, r.ID, r.CreatedBy)
}

// Tally reads the current wave for the gate; failures count only when
// some failure of the rollout is not acknowledged by a resume.
func (s *stepper) Tally(ctx context.Context, j *Job) (WaveTally, error) {
	r := s.r
	w := WaveTally{Wave: j.Wave}
	if err := s.tx.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state IN ('pending', 'in_progress')),
			count(*) FILTER (WHERE state = 'applied' AND (healthy_since IS NULL OR healthy_since > now() - make_interval(secs => $3))),
			count(*) FILTER (WHERE state = 'applied' AND healthy_since <= now() - make_interval(secs => $3)),
			count(*) FILTER (WHERE state = 'failed')
		FROM rollout_agents WHERE rollout_id = $1 AND wave = $2`, r.ID, j.Wave, j.Spec.Bake().Seconds()).Scan(&w.Open, &w.Baking, &w.Held, &w.Failed); err != nil {
		return w, err
	}
	failed, _, err := s.Failures(ctx, j)
	if failed <= 0 {
		w.Failed = 0
	}
	return w, err
}

// WaveDone records when no agent of the wave was pending or in progress
// any more.
func (s *stepper) WaveDone(ctx context.Context, j *Job) error {
	_, err := s.exec(ctx, `UPDATE rollout_waves SET completed_at = now() WHERE rollout_id = $1 AND wave = $2 AND completed_at IS NULL`, s.r.ID, j.Wave)
	return err
}

// GatePassed records when the wave's gate passed.
func (s *stepper) GatePassed(ctx context.Context, j *Job) error {
	_, err := s.exec(ctx, `UPDATE rollout_waves SET gate_passed_at = now() WHERE rollout_id = $1 AND wave = $2`, s.r.ID, j.Wave)
	return err
}

// WaveStarted records when the wave started.
func (s *stepper) WaveStarted(ctx context.Context, j *Job) error {
	_, err := s.exec(ctx, `UPDATE rollout_waves SET started_at = now() WHERE rollout_id = $1 AND wave = $2`, s.r.ID, j.Wave)
	return err
}

// Succeed makes the revision the configuration's current one.
func (s *stepper) Succeed(ctx context.Context, _ *Job) error {
	return store.SetCurrentRevision(ctx, s.tx, s.r.Config, s.r.ToRevision)
}

// RollBack sends revision A to every agent that was sent B and waits for
// their reports (or apply_timeout_s).
func (s *stepper) RollBack(ctx context.Context, j *Job) (bool, error) {
	r := s.r
	waiting, reps, err := s.agentReports(ctx, `SELECT instance_uid FROM rollout_agents WHERE rollout_id = $1 AND rollback = 'sent'`, r.ID)
	if err != nil {
		return false, err
	}
	var back, results []string
	for _, uid := range waiting {
		if a, ok := reps[uid]; reported(a, ok, s.from.Hash) {
			back, results = append(back, uid), append(results, a.ConfigStatus)
		}
	}
	if len(back) > 0 {
		if _, err := s.exec(ctx, `UPDATE rollout_agents ra SET rollback = v.result
			FROM unnest($2::text[], $3::text[]) AS v(uid, result)
			WHERE ra.rollout_id = $1 AND ra.rollback = 'sent' AND ra.instance_uid = v.uid`, r.ID, back, results); err != nil {
			return false, err
		}
	}
	if _, err := s.exec(ctx, `UPDATE rollout_agents SET rollback = 'failed'
		WHERE rollout_id = $1 AND rollback = 'sent' AND rollback_at < now() - make_interval(secs => $2)`, r.ID, j.Spec.ApplyTimeoutS); err != nil {
		return false, err
	}
	rows, err := s.tx.Query(ctx, `SELECT instance_uid FROM rollout_agents WHERE rollout_id = $1 AND rollback = ''
		AND state IN ('applied', 'in_progress', 'failed') AND sent_at IS NOT NULL ORDER BY seq`, r.ID)
	if err != nil {
		return false, err
	}
	uids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return false, err
	}
	if len(uids) > 0 {
		if err := s.send(ctx, "rollback", j.Wave, s.from, uids); err != nil {
			return false, err
		}
		_, err := s.exec(ctx, `UPDATE rollout_agents SET rollback = 'sent', rollback_at = now() WHERE rollout_id = $1 AND instance_uid = ANY($2)`,
			r.ID, uids)
		return false, err
	}
	var sent int
	if err := s.tx.QueryRow(ctx, `SELECT count(*) FROM rollout_agents WHERE rollout_id = $1 AND rollback = 'sent'`, r.ID).Scan(&sent); err != nil {
		return false, err
	}
	if sent == 0 {
		return true, store.SetCurrentRevision(ctx, s.tx, r.Config, r.FromRevision)
	}
	return false, nil
}
