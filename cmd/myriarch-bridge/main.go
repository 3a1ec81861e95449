// Command myriarch-bridge is Myriarch's MQTT bridge. Subcommands are
// registered from the files of this package.
package main

import (
	"github.com/myriarch/myriarch/internal/bridge/procs"
	"github.com/myriarch/myriarch/internal/cli"
)

var commands = &cli.Registry{Program: "myriarch-bridge", Default: "run"}

func main() {
	// GOMAXPROCS follows the bridge's CPU use (one P while it uses less
	// than most of a core) unless the environment sets it; see package
	// procs for why.
	defer procs.Start()()
	commands.Main()
}
