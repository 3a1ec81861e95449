package main

import (
	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/disclose/budgetcmd"
)

func init() {
	commands.Register(cli.Command{
		Name:    "budget",
		Summary: "compute and admit the failover budget of one exclusive session's settings",
		Run:     budgetcmd.RunBridgeBudget,
	})
}
