package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"testing"

	"github.com/myriarch/myriarch/internal/bridge/lab"
)

// TestMain lets the lab start this test binary as a bridge process.
func TestMain(m *testing.M) {
	if os.Getenv("MYRIARCH_BRIDGE_TEST_MAIN") == "1" {
		commands.Main()
	}
	os.Exit(m.Run())
}

// TestLab runs both failover scenarios with real bridge processes: the
// successor must serve, nothing may be lost, and the broker-path owner
// must exit with the step-down status.
func TestLab(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two bridge processes through two failovers (~30s)")
	}
	labExec = func(args ...string) *exec.Cmd {
		c := exec.Command(os.Args[0], args...)
		c.Env = append(os.Environ(), "MYRIARCH_BRIDGE_TEST_MAIN=1")
		return c
	}
	var out, errb bytes.Buffer
	code := commands.Dispatch([]string{"lab", "--json", "--rate", "100"}, &out, &errb)
	var rep lab.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("exit %d, not JSON: %v\n%s\n%s", code, err, out.String(), errb.String())
	}
	if code != 0 || len(rep.Scenarios) != 2 {
		t.Fatalf("exit %d: %+v\n%s", code, rep, errb.String())
	}
	for _, r := range rep.Scenarios {
		if r.Lost != 0 || r.MessagesPublished == 0 || r.FailureToFullS <= 0 || !r.WithinBudget {
			t.Errorf("%+v", r)
		}
	}
	if rep.Scenarios[1].OwnerExitCode != exitStepDown {
		t.Errorf("broker-path owner exited %d, want %d", rep.Scenarios[1].OwnerExitCode, exitStepDown)
	}
}
