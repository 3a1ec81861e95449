package rollout

import (
	"context"
	"slices"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// OrderAgents orders the planned agents (uids, sorted by instance uid) for
// the wave order: OrderUID keeps them; OrderStandbysFirst moves every
// agent that owns a session of a bridge (store.Agent.Roles) after all the
// others, keeping the order within each group, so that within a bridge
// id every standby comes before its owner and agents without roles keep
// the default order. The engine also holds an owner back until a standby
// of its bridge is healthy on the new revision (stepper.ownersGate).
func OrderAgents(ctx context.Context, q store.Querier, uids []string, order string) ([]string, error) {
	if order != OrderStandbysFirst || len(uids) == 0 {
		return uids, nil
	}
	roles, err := store.AgentBridgeRoles(ctx, q, uids)
	if err != nil {
		return nil, err
	}
	out := slices.Clone(uids)
	slices.SortStableFunc(out, func(a, b string) int {
		oa, ob := owner(roles[a]), owner(roles[b])
		switch {
		case oa == ob:
			return 0
		case oa:
			return 1
		}
		return -1
	})
	return out, nil
}

func owner(b store.BridgeRoles) bool { return b.BridgeID != "" && b.Owner() }
