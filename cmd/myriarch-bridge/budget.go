package main

import (
	"github.com/myriarch/myriarch/internal/bridge/budget"
	"github.com/myriarch/myriarch/internal/cli"
)

func init() {
	commands.Register(cli.Command{
		Name:    "budget",
		Summary: "compute and admit the failover budget of one exclusive session's settings",
		Run:     budget.RunBridgeBudget,
	})
}
