package main

import (
	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/disclose"
)

func init() {
	commands.Register(cli.Command{
		Name:    "budget",
		Summary: "derive the leader-session keepalives and the shutdown sizing from the settings",
		Run:     disclose.RunLeaderBudget,
	})
}
