package main

import internalversion "github.com/myriarch/myriarch/internal/version"

// `myriarchd version` and `myriarchd --version`; serve reports the same
// version (OpAMP, replica registry) unless -X main.version set its own.
func init() {
	internalversion.Register(commands)
	if version == "dev" {
		version = internalversion.String()
	}
}
