// Command myriarch-lab measures failover on this machine: the bridge's
// owner faults against real bridge processes (`myriarch-lab bridge`, what
// `make demo` runs) and myriarchd's leader failover against a throwaway
// PostgreSQL (`myriarch-lab leader`). It is a separate binary because it
// links what the daemons must not: an embedded broker and etcd server,
// throwaway PostgreSQL clusters and fault proxies. The bridge lab starts
// the real myriarch-bridge binary (--bridge, or the one next to this
// binary, or the one on PATH).
package main

import (
	"github.com/myriarch/myriarch/internal/anchorlab"
	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/leaderlab"
)

var commands = &cli.Registry{Program: "myriarch-lab", Default: "bridge"}

func main() {
	// A replica subprocess of the leader lab runs here and exits.
	leaderlab.MaybeRunReplica()
	anchorlab.MaybeRunCandidate() // a candidate (or etcd) subprocess of `myriarch-lab anchors`
	commands.Main()
}
