package runtime

import (
	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/routing"
)

// mappings converts a route's configured topic mappings.
func mappings(ms []config.Mapping) []routing.Mapping {
	if len(ms) == 0 {
		return nil
	}
	out := make([]routing.Mapping, len(ms))
	for i, m := range ms {
		out[i] = routing.Mapping{Pattern: m.Pattern, SourcePrefix: m.SourcePrefix, DestinationPrefix: m.DestinationPrefix}
	}
	return out
}
