package main

import (
	"fmt"
	"io"

	"github.com/myriarch/myriarch/internal/cli"
)

func init() {
	commands.Register(cli.Command{
		Name:    "failover-lab",
		Summary: "moved: the leader failover lab is `myriarch-lab leader`",
		Run: func(_ []string, _, stderr io.Writer) int {
			// The lab starts throwaway PostgreSQL clusters; myriarchd
			// must not link that machinery.
			fmt.Fprintln(stderr, "myriarchd failover-lab: the lab is now `myriarch-lab leader` (same flags): `go run ./cmd/myriarch-lab leader` or `make failover-lab`")
			return cli.ExitUsage
		},
	})
}
