package main

import (
	"fmt"
	"io"

	"github.com/myriarch/myriarch/internal/cli"
)

func init() {
	commands.Register(cli.Command{
		Name:    "lab",
		Summary: "moved: the failover lab is its own binary, myriarch-lab (make demo)",
		Run: func(_ []string, _, stderr io.Writer) int {
			// The lab links an embedded broker, an etcd server and
			// throwaway PostgreSQL clusters; the bridge binary must not.
			fmt.Fprintln(stderr, "myriarch-bridge lab: the lab is now the myriarch-lab binary: `make demo`, or `go build -o bin/ ./cmd/myriarch-bridge ./cmd/myriarch-lab && bin/myriarch-lab bridge [flags]` (same flags as before)")
			return cli.ExitUsage
		},
	})
}
