package docgen

import "github.com/myriarch/myriarch/internal/bridge/config"

// The configuration reference of docs/bridge.md: one block per YAML object
// (bridge-config-sessions, ...), rendered from the bridge's settings tables.
func init() {
	for _, r := range config.Reference {
		Tables["bridge-config-"+r.Name] = func() (string, error) { return config.MarkdownTable(r.Table), nil }
	}
}
