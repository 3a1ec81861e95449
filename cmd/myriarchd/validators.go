package main

import (
	bridgeconfig "github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/fleet/configs"
)

// The validators of the configuration types are wired here, at the
// composition root: internal/fleet/configs does not import the agents'
// code (the bridge and the fleet never import each other). Every command
// of this program (serve, and `config revise` with its --file) validates
// with them; a type without a registered validator is refused.
//
// myriarch-bridge: the bridge's check in its remote form. It runs every
// rule of `myriarch-bridge check` but reads none of the files and
// variables that the configuration names (password_file, dsn_file, tls
// files, *_env): they are on the bridge's host, which checks them when it
// applies the configuration and reports a missing one as FAILED.
func init() {
	configs.RegisterValidator(configs.TypeBridge, bridgeconfig.ValidateRemote)
}
