package api

import (
	"context"
	"errors"
	"net/url"

	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// BridgeServiceName is the service.name a myriarch-bridge reports in its
// identifying attributes.
const BridgeServiceName = "myriarch-bridge"

// kindSelectors are the shorthands of the agents list's kind filter.
var kindSelectors = map[string]map[string]string{
	"bridge": {"service.name": BridgeServiceName},
}

// withKind adds the selector of the kind query parameter to f: kind=bridge
// lists the bridges.
func withKind(q url.Values, f store.Filter) (store.Filter, error) {
	k := q.Get("kind")
	if k == "" {
		return f, nil
	}
	sel, ok := kindSelectors[k]
	if !ok {
		return f, errors.New(`kind: ` + k + `: must be "bridge"`)
	}
	if f.Selector == nil {
		f.Selector = map[string]string{}
	}
	for key, v := range sel {
		f.Selector[key] = v
	}
	return f, nil
}

// checkAgentConfig validates a remote configuration for agent uid before
// it is stored: a bridge's with the bridge's own check (the hook of the
// myriarch-bridge configuration type), so that a configuration the bridge
// would refuse is not sent. Other agents' configurations are not checked
// here. It returns store.ErrNotFound for an unknown agent.
func (a *API) checkAgentConfig(ctx context.Context, uid, body string) error {
	ag, err := a.o.Store.GetAgent(ctx, uid)
	if err != nil {
		return err
	}
	if ag.Identifying["service.name"] != BridgeServiceName || body == "" {
		return nil // an empty body clears the desired configuration
	}
	if err := configs.Validate(configs.TypeBridge, body); err != nil {
		return &InvalidConfigError{err}
	}
	return nil
}

// InvalidConfigError is a remote configuration refused by its agent's check.
type InvalidConfigError struct{ Err error }

func (e *InvalidConfigError) Error() string { return e.Err.Error() }
func (e *InvalidConfigError) Unwrap() error { return e.Err }
