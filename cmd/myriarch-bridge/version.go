package main

import "github.com/myriarch/myriarch/internal/version"

// `myriarch-bridge version` and `myriarch-bridge --version`.
func init() { version.Register(commands) }
