package rollout_test

import (
	"strings"
	"testing"

	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// A gate holds only when at least one agent of the wave applied the
// revision and stayed healthy for the bake, whatever max_failed allows: a
// canary that failed inside the allowance does not open the next wave
// (before, with max_failed 1, the second agent was sent the broken
// revision too). A wave that passes with a failure inside the allowance
// says so.
func TestGateNeedsAnAgentThatHeld(t *testing.T) {
	e := startDaemon(t)
	e.agents(3, map[string]string{"role": "edge"}, "broken")
	cs := e.d.API.Configs()
	if _, err := cs.Put(e.ctx, store.ConfigDef{Name: "edge", Type: "yaml", Selector: map[string]string{"role": "edge"}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cs.AddRevision(e.ctx, "edge", "level: 1\n", "t", ""); err != nil {
		t.Fatal(err)
	}
	rs := e.d.API.Rollouts()
	ro, err := rs.Create(e.ctx, rollout.Request{Config: "edge", Spec: rollout.Spec{Waves: []string{"100%"}, BakeS: rollout.Secs(0.1)}}, "t")
	if err != nil {
		t.Fatal(err)
	}
	e.waitState(ro.ID, rollout.StateSucceeded)
	if _, _, err := cs.AddRevision(e.ctx, "edge", "level: 2\nbroken: true\n", "t", ""); err != nil {
		t.Fatal(err)
	}
	// The default waves (1, 10%, 50%, 100%) make three waves of one agent.
	ro, err = rs.Create(e.ctx, rollout.Request{Config: "edge", Spec: rollout.Spec{BakeS: rollout.Secs(0.2), MaxFailed: 1,
		FailurePolicy: rollout.PolicyRollback}}, "t")
	if err != nil {
		t.Fatal(err)
	}
	d := e.waitState(ro.ID, rollout.StateRolledBack)
	in, err := rs.Intents(e.ctx, ro.ID)
	if err != nil {
		t.Fatal(err)
	}
	apply := 0
	for _, x := range in {
		if x.Kind == "apply" {
			apply++
		}
	}
	if apply != 1 || d.Wave != 1 || d.Counts[rollout.AgentFailed] != 1 || d.Counts[rollout.AgentPending] != 2 {
		t.Fatalf("the broken revision reached %d agents (wave %d, %v): only the canary may get it", apply, d.Wave, d.Counts)
	}
	if !strings.Contains(d.Reason, "wave 1: no agent applied the revision and stayed healthy") {
		t.Errorf("reason %q", d.Reason)
	}
	if d.WaveProgress[0].GatePassedAt != nil {
		t.Errorf("the canary's gate passed: %+v", d.WaveProgress[0])
	}

	// One agent of two fails inside max_failed 1, the other holds: the gate
	// passes and the wave reports the failure it let through.
	e.agents(1, map[string]string{"role": "mix"}, "broken")
	e.agents(1, map[string]string{"role": "mix"}, "")
	if _, err := cs.Put(e.ctx, store.ConfigDef{Name: "mix", Type: "yaml", Selector: map[string]string{"role": "mix"}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cs.AddRevision(e.ctx, "mix", "broken: for one\n", "t", ""); err != nil {
		t.Fatal(err)
	}
	ro, err = rs.Create(e.ctx, rollout.Request{Config: "mix", Spec: rollout.Spec{Waves: []string{"100%"}, BakeS: rollout.Secs(0.2), MaxFailed: 1}}, "t")
	if err != nil {
		t.Fatal(err)
	}
	d = e.waitState(ro.ID, rollout.StateSucceeded)
	if w := d.WaveProgress[0]; w.Counts[rollout.AgentFailed] != 1 || !strings.Contains(w.Note, "gate passed with 1 failed agent(s) inside the allowance (max_failed 1") {
		t.Errorf("wave with a failure inside the allowance: %+v", w)
	}
}
