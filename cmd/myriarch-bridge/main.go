// Command myriarch-bridge is Myriarch's MQTT bridge. Subcommands are
// registered from the files of this package.
package main

import (
	"os"
	"strings"

	"github.com/myriarch/myriarch/internal/bridge/procs"
	"github.com/myriarch/myriarch/internal/cli"
)

var commands = &cli.Registry{Program: "myriarch-bridge", Default: "run"}

func main() {
	if runsBridge(os.Args[1:]) {
		// GOMAXPROCS follows the bridge's CPU use (one P while it uses
		// less than most of a core) unless the environment sets it; see
		// package procs for why. The other commands (check, lab, ...) keep
		// the runtime's default. The controller runs until the process
		// exits (commands.Main ends with os.Exit), so its stop function
		// is not kept.
		procs.Start()
	}
	commands.Main()
}

// runsBridge reports whether args run the bridge: the run command, named
// or as the default (no command, or flags first).
func runsBridge(args []string) bool {
	if len(args) == 0 || args[0] == "run" {
		return true
	}
	return strings.HasPrefix(args[0], "-") && args[0] != "-h" && args[0] != "--help"
}
