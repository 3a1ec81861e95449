// Command myriarchd is Myriarch's fleet control plane. Subcommands are
// registered from the files of this package.
package main

import "github.com/myriarch/myriarch/internal/cli"

var commands = &cli.Registry{Program: "myriarchd", Default: "serve"}

func main() { commands.Main() }
