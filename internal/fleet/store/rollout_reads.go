package store

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"
)

// BridgeRoles is what a rollout reads of an agent to order and gate it
// (wave order standbys-first): the bridge id and the session roles it
// reports now (Agent.BridgeID, Agent.Roles; empty for agents that are not
// bridges).
type BridgeRoles struct {
	BridgeID string   `json:"bridge_id"`
	Roles    []string `json:"roles"`
}

// Owner reports whether the agent owns at least one session.
func (b BridgeRoles) Owner() bool {
	for _, r := range b.Roles {
		if r == RoleOwner {
			return true
		}
	}
	return false
}

// AgentBridgeRoles returns the bridge id and roles of the agents among uids
// that exist.
func AgentBridgeRoles(ctx context.Context, q Querier, uids []string) (map[string]BridgeRoles, error) {
	rows, err := q.Query(ctx, `SELECT instance_uid, non_identifying, health FROM agents WHERE instance_uid = ANY($1)`, uids)
	if err != nil {
		return nil, err
	}
	out := make(map[string]BridgeRoles, len(uids))
	var a Agent
	var health []byte
	_, err = pgx.ForEachRow(rows, []any{&a.InstanceUID, &a.NonIdentifying, &health}, func() error {
		a.Health = json.RawMessage(health)
		out[a.InstanceUID] = BridgeRoles{BridgeID: a.BridgeID(), Roles: a.Roles()}
		a = Agent{}
		return nil
	})
	return out, err
}

// BridgeMembers returns the uids of the agents that report bridge id id
// (the processes of one bridge, online or not), sorted.
func BridgeMembers(ctx context.Context, q Querier, id string) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT instance_uid FROM agents WHERE non_identifying->>$1 = $2 ORDER BY instance_uid`, BridgeIDAttribute, id)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
