package main

import (
	"strings"
	"testing"
)

func TestRunsBridge(t *testing.T) {
	for args, want := range map[string]bool{
		"":                     true,
		"run":                  true,
		"run -c bridge.yaml":   true,
		"-c bridge.yaml":       true,
		"check -c bridge.yaml": false,
		"lab":                  false,
		"version":              false,
		"-h":                   false,
		"--help":               false,
		"help":                 false,
	} {
		if got := runsBridge(strings.Fields(args)); got != want {
			t.Errorf("runsBridge(%q) = %v, want %v", args, got, want)
		}
	}
}
