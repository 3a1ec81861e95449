package rollout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// Errors of the service; the API maps them to status codes.
var (
	// ErrConflict: an overlapping rollout is active, or a command does not
	// fit the state.
	ErrConflict = errors.New("conflict")
)

// InvalidError is refused input.
type InvalidError struct{ Err error }

func (e *InvalidError) Error() string { return e.Err.Error() }
func (e *InvalidError) Unwrap() error { return e.Err }

// Request creates a rollout.
type Request struct {
	Config string `json:"config"`
	// ToRevision defaults to the newest revision; FromRevision is the
	// configuration's current revision (what the last successful rollout
	// delivered; 0 when none).
	ToRevision int  `json:"to_revision"`
	Spec       Spec `json:"spec"`
}

// Service is the operator side of rollouts (API, UI, CLI, GitOps).
type Service struct {
	Store *store.Store
}

// Create validates req and stores a pending rollout; the leader plans it.
// A rollout of a configuration that has an active rollout is refused
// (ErrConflict), and so, when it is planned, is one that would reach an
// agent of another active rollout.
func (s Service) Create(ctx context.Context, req Request, by string) (Rollout, error) {
	var out Rollout
	err := pgx.BeginFunc(ctx, s.Store.Pool, func(tx pgx.Tx) error {
		var err error
		out, err = Create(ctx, tx, req, by)
		return err
	})
	return out, err
}

// Create is Service.Create in a caller's transaction (GitOps creates
// rollouts in its fenced one).
func Create(ctx context.Context, tx pgx.Tx, req Request, by string) (Rollout, error) {
	// One creator at a time, so that two concurrent creations for one
	// configuration cannot both pass the overlap check.
	if _, err := tx.Exec(ctx, `LOCK TABLE rollouts IN SHARE ROW EXCLUSIVE MODE`); err != nil {
		return Rollout{}, err
	}
	c, to, sp, err := resolve(ctx, tx, req)
	if err != nil {
		return Rollout{}, err
	}
	spec, _ := json.Marshal(sp)
	return scanRollout(tx.QueryRow(ctx, `INSERT INTO rollouts (config, from_revision, to_revision, spec, state, created_by)
		VALUES ($1, $2, $3, $4, 'pending', $5) RETURNING `+rolloutCols, c.Name, c.CurrentRevision, to, spec, by))
}

// resolve checks a request as Create does (the plan preview too): the
// configuration, the target revision, the spec, and no active rollout of
// the configuration.
func resolve(ctx context.Context, q store.Querier, req Request) (store.ConfigDef, int, Spec, error) {
	sp := req.Spec.WithDefaults()
	if err := sp.Validate(); err != nil {
		return store.ConfigDef{}, 0, sp, &InvalidError{err}
	}
	c, err := store.GetConfig(ctx, q, req.Config)
	if errors.Is(err, store.ErrNotFound) {
		return c, 0, sp, &InvalidError{fmt.Errorf("config %q: no such configuration", req.Config)}
	}
	if err != nil {
		return c, 0, sp, err
	}
	if c.DeletedAt != nil {
		return c, 0, sp, &InvalidError{fmt.Errorf("config %q: the configuration is deleted", req.Config)}
	}
	to := req.ToRevision
	if to == 0 {
		to = c.LatestRevision
	}
	if to == 0 {
		return c, 0, sp, &InvalidError{fmt.Errorf("config %q: has no revision yet", req.Config)}
	}
	if to < 0 || to > c.LatestRevision {
		return c, 0, sp, &InvalidError{fmt.Errorf("to_revision %d: must be a revision of %s (1 to %d)", to, c.Name, c.LatestRevision)}
	}
	if to == c.CurrentRevision {
		return c, 0, sp, &InvalidError{fmt.Errorf("to_revision %d: is already the current revision of %s", to, c.Name)}
	}
	if sp.FailurePolicy == PolicyRollback && c.CurrentRevision == 0 {
		return c, 0, sp, &InvalidError{fmt.Errorf("failure_policy rollback: %s has no current revision to roll back to (use pause)", c.Name)}
	}
	var other int64
	err = q.QueryRow(ctx, `SELECT id FROM rollouts WHERE config = $1 AND state = ANY($2) ORDER BY id LIMIT 1`, c.Name, ActiveStates).Scan(&other)
	if err == nil {
		return c, 0, sp, fmt.Errorf("%w: rollout %d of %s is still active; overlapping rollouts are refused (abort it or wait)", ErrConflict, other, c.Name)
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return c, 0, sp, err
	}
	return c, to, sp, nil
}

// Command requests pause, resume, abort or rollback; the leader's engine
// carries it out within one pass.
func (s Service) Command(ctx context.Context, id int64, cmd string) (Rollout, error) {
	allowed := map[string][]string{
		CmdPause:    {StatePending, StateRunning},
		CmdResume:   {StatePaused},
		CmdAbort:    ActiveStates,
		CmdRollback: {StateRunning, StatePaused},
	}
	states, ok := allowed[cmd]
	if !ok {
		return Rollout{}, &InvalidError{fmt.Errorf("command %q: must be pause, resume, abort or rollback", cmd)}
	}
	r, err := s.Get(ctx, id)
	if err != nil {
		return r, err
	}
	if cmd == CmdRollback && r.FromRevision == 0 {
		return r, fmt.Errorf("%w: rollout %d has no revision to roll back to", ErrConflict, id)
	}
	row := s.Store.Pool.QueryRow(ctx, `UPDATE rollouts SET requested = $2, updated_at = now() WHERE id = $1 AND state = ANY($3)
		RETURNING `+rolloutCols, id, cmd, states)
	r2, err := scanRollout(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("%w: rollout %d is %s; %s needs one of %v", ErrConflict, id, r.State, cmd, states)
	}
	return r2, err
}

// Get returns one rollout.
func (s Service) Get(ctx context.Context, id int64) (Rollout, error) {
	r, err := scanRollout(s.Store.Pool.QueryRow(ctx, "SELECT "+rolloutCols+" FROM rollouts WHERE id = $1", id))
	if errors.Is(err, pgx.ErrNoRows) {
		return r, store.ErrNotFound
	}
	return r, err
}

// Summary is a rollout with its agent counts by state.
type Summary struct {
	Rollout
	Counts map[string]int `json:"agents"`
}

// List returns the newest rollouts first (limit ≤ 1000), optionally of one
// configuration.
func (s Service) List(ctx context.Context, config string, limit int) ([]Summary, error) {
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	rows, err := s.Store.Pool.Query(ctx, "SELECT "+rolloutCols+" FROM rollouts WHERE ($1 = '' OR config = $1) ORDER BY id DESC LIMIT $2", config, limit)
	if err != nil {
		return nil, err
	}
	rs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Rollout, error) { return scanRollout(r) })
	if err != nil {
		return nil, err
	}
	out := make([]Summary, 0, len(rs))
	ids := make([]int64, 0, len(rs))
	idx := map[int64]int{}
	for _, r := range rs {
		idx[r.ID] = len(out)
		ids = append(ids, r.ID)
		out = append(out, Summary{Rollout: r, Counts: emptyCounts()})
	}
	crow, err := s.Store.Pool.Query(ctx, `SELECT rollout_id, state, count(*) FROM rollout_agents WHERE rollout_id = ANY($1) GROUP BY 1, 2`, ids)
	if err != nil {
		return nil, err
	}
	var id int64
	var st string
	var n int
	_, err = pgx.ForEachRow(crow, []any{&id, &st, &n}, func() error {
		out[idx[id]].Counts[st] = n
		return nil
	})
	return out, err
}

func emptyCounts() map[string]int {
	m := map[string]int{}
	for _, st := range AgentStates {
		m[st] = 0
	}
	return m
}

// WaveProgress is one wave of a rollout.
type WaveProgress struct {
	Wave         int            `json:"wave"`
	Size         int            `json:"size"`
	Counts       map[string]int `json:"agents"`
	StartedAt    *time.Time     `json:"started_at"`
	CompletedAt  *time.Time     `json:"completed_at"`
	GatePassedAt *time.Time     `json:"gate_passed_at"`
	// Note reports what the gate let through: a wave whose gate passed
	// with failed agents inside the allowance (max_failed,
	// max_failed_percent) says so ("" otherwise).
	Note string `json:"note,omitempty"`
}

// Done is the share of the wave's agents that are no longer pending or in
// progress, in percent.
func (w WaveProgress) Done() int {
	if w.Size == 0 {
		return 100
	}
	return 100 * (w.Size - w.Counts[AgentPending] - w.Counts[AgentInProgress]) / w.Size
}

// AgentProgress is one agent of a rollout.
type AgentProgress struct {
	InstanceUID  string     `json:"instance_uid"`
	Wave         int        `json:"wave"`
	Seq          int        `json:"seq"`
	State        string     `json:"state"`
	Rollback     string     `json:"rollback,omitempty"`
	Detail       string     `json:"detail"`
	SentAt       *time.Time `json:"sent_at"`
	ReportedAt   *time.Time `json:"reported_at"`
	HealthySince *time.Time `json:"healthy_since"`
	// BridgeID and Roles are what the agent reports now (bridges; empty
	// for other agents): the wave order standbys-first orders by them.
	BridgeID string   `json:"bridge_id"`
	Roles    []string `json:"roles"`
}

// Detail is a rollout with its waves and agents.
type Detail struct {
	Summary
	WaveProgress []WaveProgress  `json:"wave_progress"`
	Agents       []AgentProgress `json:"agent_progress"`
	// AgentsTruncated is true when only the first agents are listed.
	AgentsTruncated bool `json:"agents_truncated"`
}

// Detail returns a rollout with its waves and up to agentLimit agents
// (the failed ones first, then in wave order).
func (s Service) Detail(ctx context.Context, id int64, agentLimit int) (Detail, error) {
	r, err := s.Get(ctx, id)
	if err != nil {
		return Detail{}, err
	}
	d := Detail{Summary: Summary{Rollout: r, Counts: emptyCounts()}, WaveProgress: []WaveProgress{}, Agents: []AgentProgress{}}
	rows, err := s.Store.Pool.Query(ctx, `SELECT w.wave, w.size, w.started_at, w.completed_at, w.gate_passed_at,
			coalesce((SELECT jsonb_object_agg(state, n) FROM (SELECT state, count(*) AS n FROM rollout_agents ra
				WHERE ra.rollout_id = w.rollout_id AND ra.wave = w.wave GROUP BY state) x), '{}')
		FROM rollout_waves w WHERE w.rollout_id = $1 ORDER BY w.wave`, id)
	if err != nil {
		return d, err
	}
	var wp WaveProgress
	var counts map[string]int
	_, err = pgx.ForEachRow(rows, []any{&wp.Wave, &wp.Size, &wp.StartedAt, &wp.CompletedAt, &wp.GatePassedAt, &counts}, func() error {
		w := wp
		w.Counts = emptyCounts()
		for k, v := range counts {
			w.Counts[k] = v
			d.Counts[k] += v
		}
		if n := w.Counts[AgentFailed]; n > 0 && w.GatePassedAt != nil {
			w.Note = fmt.Sprintf("gate passed with %d failed agent(s) inside the allowance (max_failed %d, max_failed_percent %g)",
				n, r.Spec.MaxFailed, r.Spec.MaxFailedPercent)
		}
		d.WaveProgress = append(d.WaveProgress, w)
		return nil
	})
	if err != nil {
		return d, err
	}
	if agentLimit <= 0 {
		agentLimit = 1000
	}
	rows, err = s.Store.Pool.Query(ctx, `SELECT instance_uid, wave, seq, state, rollback, detail, sent_at, reported_at, healthy_since
		FROM rollout_agents WHERE rollout_id = $1 ORDER BY (state = 'failed') DESC, seq LIMIT $2`, id, agentLimit+1)
	if err != nil {
		return d, err
	}
	d.Agents, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (AgentProgress, error) {
		var a AgentProgress
		err := row.Scan(&a.InstanceUID, &a.Wave, &a.Seq, &a.State, &a.Rollback, &a.Detail, &a.SentAt, &a.ReportedAt, &a.HealthySince)
		a.Roles = []string{}
		return a, err
	})
	if err != nil {
		return d, err
	}
	uids := make([]string, len(d.Agents))
	for i, a := range d.Agents {
		uids[i] = a.InstanceUID
	}
	roles, err := store.AgentBridgeRoles(ctx, s.Store.Pool, uids)
	for i := range d.Agents {
		if br, ok := roles[d.Agents[i].InstanceUID]; ok {
			d.Agents[i].BridgeID = br.BridgeID
			if br.Roles != nil {
				d.Agents[i].Roles = br.Roles
			}
		}
	}
	if len(d.Agents) > agentLimit {
		d.Agents, d.AgentsTruncated = d.Agents[:agentLimit], true
	}
	if d.Agents == nil {
		d.Agents = []AgentProgress{}
	}
	return d, err
}

// Intent is one recorded command to an agent.
type Intent struct {
	ID          int64     `json:"id"`
	RolloutID   *int64    `json:"rollout_id"`
	Config      string    `json:"config"`
	InstanceUID string    `json:"instance_uid"`
	Wave        int       `json:"wave"`
	Term        int64     `json:"term"`
	Kind        string    `json:"kind"`
	Revision    int       `json:"revision"`
	Hash        string    `json:"hash"`
	At          time.Time `json:"at"`
}

// AgentIntents returns the newest intents for one agent (of rollouts and
// assignments), newest first.
func (s Service) AgentIntents(ctx context.Context, uid string, limit int) ([]Intent, error) {
	rows, err := s.Store.Pool.Query(ctx, `SELECT id, rollout_id, config, instance_uid, wave, term, kind, revision, hash, at
		FROM rollout_intents WHERE instance_uid = $1 ORDER BY id DESC LIMIT $2`, uid, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Intent])
}

// Intents returns the intents of a rollout in the order they were written.
func (s Service) Intents(ctx context.Context, id int64) ([]Intent, error) {
	rows, err := s.Store.Pool.Query(ctx, `SELECT id, rollout_id, config, instance_uid, wave, term, kind, revision, hash, at
		FROM rollout_intents WHERE rollout_id = $1 ORDER BY id`, id)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Intent])
}

// Collector exports the rollout metrics from the database, the same on
// every replica: myriarch_rollouts_active, and per active rollout
// myriarch_rollout_paused, myriarch_rollout_wave,
// myriarch_rollout_agents{state} and
// myriarch_rollout_last_progress_timestamp_seconds.
type Collector struct {
	Store *store.Store
}

var (
	descActive   = prometheus.NewDesc("myriarch_rollouts_active", "Rollouts that are pending, running, paused or rolling back.", nil, nil)
	descPaused   = prometheus.NewDesc("myriarch_rollout_paused", "1 while the rollout is paused.", []string{"rollout"}, nil)
	descWave     = prometheus.NewDesc("myriarch_rollout_wave", "Current wave of the rollout (1-based; 0 before it is planned).", []string{"rollout"}, nil)
	descAgents   = prometheus.NewDesc("myriarch_rollout_agents", "Agents of the rollout by state.", []string{"rollout", "state"}, nil)
	descProgress = prometheus.NewDesc("myriarch_rollout_last_progress_timestamp_seconds", "Last time the rollout changed (an agent state, a wave or its state).", []string{"rollout"}, nil)
)

// Describe implements prometheus.Collector.
func (c Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descActive, descPaused, descWave, descAgents, descProgress} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	rows, err := c.Store.Pool.Query(ctx, `SELECT r.id, r.state, r.wave, r.last_progress_at,
			coalesce((SELECT jsonb_object_agg(state, n) FROM (SELECT state, count(*) AS n FROM rollout_agents ra
				WHERE ra.rollout_id = r.id GROUP BY state) x), '{}')
		FROM rollouts r WHERE r.state = ANY($1) ORDER BY r.id`, ActiveStates)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descActive, err)
		return
	}
	var id int64
	var state string
	var wave int
	var progress time.Time
	var counts map[string]int
	n := 0
	_, err = pgx.ForEachRow(rows, []any{&id, &state, &wave, &progress, &counts}, func() error {
		n++
		l := fmt.Sprint(id)
		paused := 0.0
		if state == StatePaused {
			paused = 1
		}
		ch <- prometheus.MustNewConstMetric(descPaused, prometheus.GaugeValue, paused, l)
		ch <- prometheus.MustNewConstMetric(descWave, prometheus.GaugeValue, float64(wave), l)
		ch <- prometheus.MustNewConstMetric(descProgress, prometheus.GaugeValue, float64(progress.UnixNano())/1e9, l)
		for _, st := range AgentStates {
			ch <- prometheus.MustNewConstMetric(descAgents, prometheus.GaugeValue, float64(counts[st]), l, st)
		}
		return nil
	})
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descActive, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, float64(n))
}
