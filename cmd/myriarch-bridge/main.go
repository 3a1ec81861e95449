// Command myriarch-bridge is Myriarch's MQTT bridge. Subcommands are
// registered from the files of this package.
package main

import "github.com/myriarch/myriarch/internal/cli"

var commands = &cli.Registry{Program: "myriarch-bridge", Default: "run"}

func main() { commands.Main() }
