package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBudgetReadsLoadedConfig(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "myriarchd.yaml")
	if err := os.WriteFile(file, []byte("ha:\n  leaderSessionTimeout: 10s\nserver:\n  shutdownTimeout: 45s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (map[string]any, string, int) {
		var out, errOut bytes.Buffer
		code := runBudget(args, &out, &errOut)
		var m map[string]any
		_ = json.Unmarshal(out.Bytes(), &m)
		return m, errOut.String(), code
	}
	m, stderr, code := run("-c", file, "--json")
	if code != 0 || m["leader_session_timeout_s"] != 10.0 || m["detection_s"] != 7.0 || m["termination_grace_period_s"] != 120.0 {
		t.Fatalf("from file: exit %d %s %v", code, stderr, m)
	}
	// An explicit flag wins over the file.
	m, _, code = run("--config="+file, "--leader-session-timeout", "30s", "--json")
	if code != 0 || m["detection_s"] != 22.0 || m["termination_grace_period_s"] != 120.0 {
		t.Fatalf("flag override: exit %d %v", code, m)
	}
	// The environment is part of the loaded config.
	t.Setenv("MYRIARCH_HA_LEADERSESSIONTIMEOUT", "10m")
	m, _, code = run("--json")
	if code != 0 || m["detection_s"] != 564.0 {
		t.Fatalf("env: exit %d %v", code, m)
	}
	t.Setenv("MYRIARCH_HA_LEADERSESSIONTIMEOUT", "5s")
	m, stderr, code = run("--json")
	if code != 2 || !strings.Contains(stderr, "ha.leaderSessionTimeout") || m["errors"] == nil {
		t.Fatalf("bad env: exit %d %q %v", code, stderr, m)
	}
}
