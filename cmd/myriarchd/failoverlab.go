package main

import "github.com/myriarch/myriarch/internal/cli"

// The lab starts throwaway PostgreSQL clusters; myriarchd must not link
// that machinery.
func init() {
	commands.Register(cli.Moved("failover-lab", "moved: the leader failover lab is `myriarch-lab leader`",
		"myriarchd failover-lab: the lab is now `myriarch-lab leader` (same flags): `go run ./cmd/myriarch-lab leader` or `make failover-lab`"))
}
