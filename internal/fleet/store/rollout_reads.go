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

// MatchingElsewhere returns the agents whose attributes match attrs but
// that are assigned another configuration than config (by priority, then
// name; PrecedenceSQL), with the configuration they are assigned ("" for
// none): what a rollout of config would leave out.
func MatchingElsewhere(ctx context.Context, q Querier, attrs map[string]string, config string) (map[string]string, error) {
	rows, err := q.Query(ctx, `SELECT a.instance_uid, coalesce(`+PrecedenceSQL+`, '') FROM agents a
		WHERE a.attrs @> $1 AND `+PrecedenceSQL+` IS DISTINCT FROM $2`, attrs, config)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	var uid, c string
	_, err = pgx.ForEachRow(rows, []any{&uid, &c}, func() error { out[uid] = c; return nil })
	return out, err
}

// EffectiveConfigs returns the effective config each agent among uids
// reports now ("" when it reports none).
func EffectiveConfigs(ctx context.Context, q Querier, uids []string) (map[string]string, error) {
	rows, err := q.Query(ctx, `SELECT instance_uid, effective_config FROM agents WHERE instance_uid = ANY($1)`, uids)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(uids))
	var uid, c string
	_, err = pgx.ForEachRow(rows, []any{&uid, &c}, func() error { out[uid] = c; return nil })
	return out, err
}
