package main

import "github.com/myriarch/myriarch/internal/cli"

// The lab links an embedded broker, an etcd server and throwaway
// PostgreSQL clusters; the bridge binary must not.
func init() {
	commands.Register(cli.Moved("lab", "moved: the failover lab is its own binary, myriarch-lab (make demo)",
		"myriarch-bridge lab: the lab is now the myriarch-lab binary: `make demo`, or `go build -o bin/ ./cmd/myriarch-bridge ./cmd/myriarch-lab && bin/myriarch-lab bridge [flags]` (same flags as before)"))
}
