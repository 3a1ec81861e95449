package main

import (
	"os"
	"testing"
)

// TestMain lets tests start this test binary as a bridge process
// (MYRIARCH_BRIDGE_TEST_MAIN=1): the end-to-end tests run real bridges
// that way, with the race detector on.
func TestMain(m *testing.M) {
	if os.Getenv("MYRIARCH_BRIDGE_TEST_MAIN") == "1" {
		commands.Main()
	}
	os.Exit(m.Run())
}
