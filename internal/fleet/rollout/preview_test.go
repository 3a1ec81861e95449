package rollout_test

import (
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// The previews over the API: a rollout's dry run (same body and refusals
// as POST /api/v1/rollouts, nothing stored), a revision against what each
// agent runs now (grouped by effective config), and the diff from
// revision 0, the empty document.
func TestPreviewsOverTheAPI(t *testing.T) {
	e := startDaemon(t)
	ags := e.agents(3, map[string]string{"role": "edge"}, "")
	special := e.agents(1, map[string]string{"role": "edge", "zone": "b"}, "")[0]
	cs := e.d.API.Configs()
	for _, c := range []store.ConfigDef{{Name: "edge", Type: "yaml", Selector: map[string]string{"role": "edge"}},
		{Name: "edge-b", Type: "yaml", Selector: map[string]string{"zone": "b"}, Priority: 10}} {
		if _, err := cs.Put(e.ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	var df struct{ Diff string }
	if c := e.call("GET", "/api/v1/configs/edge/diff?from=0&to=1", nil, &df); c != 404 {
		t.Errorf("diff to a revision that does not exist: %d", c)
	}
	if _, _, err := cs.AddRevision(e.ctx, "edge", "level: 1\n", "t", ""); err != nil {
		t.Fatal(err)
	}
	if c := e.call("GET", "/api/v1/configs/edge/diff?from=0&to=1", nil, &df); c != 200 || !strings.Contains(df.Diff, "--- edge revision 0\n+++ edge revision 1\n") ||
		!strings.Contains(df.Diff, "+level: 1\n") {
		t.Errorf("diff 0 → 1: %d %q", c, df.Diff)
	}
	if c := e.call("GET", "/api/v1/configs/edge/diff?from=-1&to=1", nil, nil); c != 400 {
		t.Errorf("diff from -1: %d", c)
	}

	// The plan of the first rollout: three agents (the fourth is assigned
	// edge-b by priority), waves 1 and 100 %.
	body := rollout.Request{Config: "edge", Spec: rollout.Spec{Waves: []string{"1", "100%"}, BakeS: rollout.Secs(0.1)}}
	var plan rollout.Plan
	if c := e.call("POST", "/api/v1/rollouts/plan", body, &plan); c != 200 || plan.Config != "edge" || plan.Revision != 1 || plan.Order != rollout.OrderUID ||
		len(plan.Waves) != 2 || plan.Waves[0].Index != 1 || len(plan.Waves[0].Agents) != 1 || len(plan.Waves[1].Agents) != 2 {
		t.Fatalf("plan: %d %+v", c, plan)
	}
	if len(plan.Skipped) != 1 || plan.Skipped[0].UID != special.UIDString() || !strings.Contains(plan.Skipped[0].Reason, "assigned configuration edge-b") {
		t.Errorf("skipped: %+v", plan.Skipped)
	}
	if uid := plan.Waves[0].Agents[0].UID; uid > plan.Waves[1].Agents[0].UID || plan.Waves[1].Agents[0].UID > plan.Waves[1].Agents[1].UID {
		t.Errorf("order uid: %+v", plan.Waves)
	}
	var er map[string]string
	bad := body
	bad.Spec.Order = "owner-first"
	if c := e.call("POST", "/api/v1/rollouts/plan", bad, &er); c != 400 || !strings.Contains(er["error"], `order "owner-first": must be uid or standbys-first`) {
		t.Errorf("plan with an unknown order: %d %v", c, er)
	}
	if c := e.call("POST", "/api/v1/rollouts", bad, &er); c != 400 || !strings.Contains(er["error"], `order "owner-first"`) {
		t.Errorf("rollout with an unknown order: %d %v", c, er)
	}
	var list struct{ Rollouts []rollout.Summary }
	if e.call("GET", "/api/v1/rollouts", nil, &list); len(list.Rollouts) != 0 {
		t.Fatalf("the plan stored a rollout: %+v", list)
	}

	var ro rollout.Rollout
	if c := e.call("POST", "/api/v1/rollouts", body, &ro); c != 202 {
		t.Fatalf("rollout: %d", c)
	}
	e.waitState(ro.ID, rollout.StateSucceeded)
	if c := e.call("POST", "/api/v1/rollouts/plan", body, &er); c != 400 || !strings.Contains(er["error"], "already the current revision") {
		t.Errorf("plan of the current revision: %d %v", c, er)
	}
	if _, _, err := cs.AddRevision(e.ctx, "edge", "level: 2\n", "t", ""); err != nil {
		t.Fatal(err)
	}
	// One agent runs something else (a direct push).
	if _, err := e.d.Store.SetDesiredConfig(e.ctx, ags[2].UIDString(), "level: direct\n"); err != nil {
		t.Fatal(err)
	}
	var pv configs.Preview
	if !fleettest.Eventually(30*time.Second, func() bool {
		e.call("GET", "/api/v1/configs/edge/revisions/2/preview", nil, &pv)
		return len(pv.Groups) == 2
	}) {
		t.Fatalf("preview: %+v", pv)
	}
	g := pv.Groups[0]
	if pv.Config != "edge" || pv.Revision != 2 || pv.Hash != store.ConfigHash("level: 2\n") || len(g.Agents) != 2 || g.UpToDate ||
		g.EffectiveHash != store.ConfigHash("level: 1\n") || !strings.Contains(g.Diff, "-level: 1\n+level: 2\n") {
		t.Errorf("preview, first group: %+v", pv)
	}
	if g := pv.Groups[1]; len(g.Agents) != 1 || g.Agents[0] != ags[2].UIDString() || !strings.Contains(g.Diff, "-level: direct\n+level: 2\n") {
		t.Errorf("preview, second group: %+v", g)
	}
	if c := e.call("GET", "/api/v1/configs/edge/revisions/1/preview?selector=zone=b", nil, &pv); c != 200 || len(pv.Groups) != 0 {
		t.Errorf("preview narrowed to no agent: %d %+v", c, pv)
	}
	if e.call("GET", "/api/v1/configs/edge/revisions/1/preview", nil, &pv); len(pv.Groups) != 2 || !pv.Groups[0].UpToDate || pv.Groups[0].Diff != "" {
		t.Errorf("preview of the revision they run: %+v", pv)
	}
	if c := e.call("GET", "/api/v1/configs/edge/revisions/9/preview", nil, nil); c != 404 {
		t.Errorf("preview of a missing revision: %d", c)
	}
	if c := e.call("GET", "/api/v1/configs/edge/revisions/1/preview?selector=zone", nil, nil); c != 400 {
		t.Errorf("preview with a bad selector: %d", c)
	}
}
