package rollout

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// Plan is the dry run of a rollout request (POST /api/v1/rollouts/plan):
// the waves the planner would make now, with their agents in order, and
// the agents the rollout would leave out or skip, and why. Nothing is
// stored.
type Plan struct {
	Config   string     `json:"config"`
	Revision int        `json:"revision"`
	Order    string     `json:"order"`
	Waves    []PlanWave `json:"waves"`
	Skipped  []PlanSkip `json:"skipped"`
}

// PlanWave is one wave of a plan; Index is the wave's number (1-based).
type PlanWave struct {
	Index  int         `json:"index"`
	Agents []PlanAgent `json:"agents"`
}

// PlanAgent is one agent of a planned wave, with the bridge id and roles
// it reports now (empty for agents that are not bridges).
type PlanAgent struct {
	UID      string   `json:"uid"`
	BridgeID string   `json:"bridge_id"`
	Roles    []string `json:"roles"`
}

// PlanSkip is an agent that the rollout would not send the revision, and
// why: it matches the selector but is assigned another configuration, or
// it belongs to another active rollout (the rollout would be refused when
// planned), or it is offline now (it stays in its wave and is skipped at
// its turn unless it reconnects).
type PlanSkip struct {
	UID    string `json:"uid"`
	Reason string `json:"reason"`
}

// Plan answers what Create would start, without storing anything: the
// same checks (a refused request is refused the same way), then the
// planner's selection, order and waves.
func (s Service) Plan(ctx context.Context, req Request) (Plan, error) {
	var p Plan
	err := pgx.BeginTxFunc(ctx, s.Store.Pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		p, err = dryRun(ctx, tx, req)
		return err
	})
	return p, err
}

func dryRun(ctx context.Context, tx pgx.Tx, req Request) (Plan, error) {
	c, to, sp, err := resolve(ctx, tx, req)
	if err != nil {
		return Plan{}, err
	}
	p := Plan{Config: c.Name, Revision: to, Order: sp.Order, Waves: []PlanWave{}, Skipped: []PlanSkip{}}
	sel := Selector(c, sp)
	uids, err := store.AgentsAssigned(ctx, tx, sel, c.Name)
	if err != nil {
		return p, err
	}
	elsewhere, err := store.MatchingElsewhere(ctx, tx, sel, c.Name)
	if err != nil {
		return p, err
	}
	for _, uid := range slices.Sorted(maps.Keys(elsewhere)) {
		why := "matches the selector but no configuration is assigned to it"
		if other := elsewhere[uid]; other != "" {
			why = fmt.Sprintf("matches the selector but is assigned configuration %s (priority, then name)", other)
		}
		p.Skipped = append(p.Skipped, PlanSkip{UID: uid, Reason: why})
	}
	if len(uids) == 0 {
		return p, nil
	}
	rows, err := tx.Query(ctx, `SELECT ra.instance_uid, ra.rollout_id FROM rollout_agents ra JOIN rollouts o ON o.id = ra.rollout_id
		WHERE o.state = ANY($1) AND ra.instance_uid = ANY($2) ORDER BY 1`, ActiveStates, uids)
	if err != nil {
		return p, err
	}
	var uid string
	var other int64
	if _, err := pgx.ForEachRow(rows, []any{&uid, &other}, func() error {
		p.Skipped = append(p.Skipped, PlanSkip{UID: uid, Reason: fmt.Sprintf("belongs to active rollout %d: the rollout would be refused when planned (overlapping rollouts are refused)", other)})
		return nil
	}); err != nil {
		return p, err
	}
	if uids, err = OrderAgents(ctx, tx, uids, sp.Order); err != nil {
		return p, err
	}
	roles, err := store.AgentBridgeRoles(ctx, tx, uids)
	if err != nil {
		return p, err
	}
	reps, err := store.ConfigReports(ctx, tx, uids)
	if err != nil {
		return p, err
	}
	i := 0
	for w, n := range sp.WaveSizes(len(uids)) {
		pw := PlanWave{Index: w + 1, Agents: make([]PlanAgent, 0, n)}
		for _, uid := range uids[i : i+n] {
			br := roles[uid]
			if br.Roles == nil {
				br.Roles = []string{}
			}
			pw.Agents = append(pw.Agents, PlanAgent{UID: uid, BridgeID: br.BridgeID, Roles: br.Roles})
			if !reps[uid].Online {
				p.Skipped = append(p.Skipped, PlanSkip{UID: uid, Reason: fmt.Sprintf("offline now: stays in wave %d and is skipped at its turn unless it reconnects", w+1)})
			}
		}
		i += n
		p.Waves = append(p.Waves, pw)
	}
	return p, nil
}
