package ui_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// The configuration and rollout pages in a real browser: a configuration's
// revisions and their diff, a rollout started from the page that runs to
// the end with its waves, and a second one paused, resumed and rolled back
// with the page's buttons.
func TestRolloutPagesInHeadlessChromium(t *testing.T) {
	browser := chromium(t)
	const secret = "0123456789abcdef-secret" // startUI's enrollment secret
	d := startUI(t, "replica-ui", map[string]string{"ha.heartbeatInterval": "1s", "server.lastSeenFlushInterval": "200ms", "jobs.rolloutInterval": "100ms"})
	ctx := context.Background()
	tok, err := d.Store.CreateToken(ctx, "ui")
	if err != nil {
		t.Fatal(err)
	}
	var ags []*fleettest.Agent
	for range 3 {
		ag, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + d.OpAMPAddr().String() + "/v1/opamp", Secret: secret,
			Attrs: map[string]string{"role": "gw"}})
		if err != nil {
			t.Fatal(err)
		}
		defer ag.Stop(ctx)
		ags = append(ags, ag)
	}
	if !fleettest.Eventually(30*time.Second, func() bool {
		var n int
		_ = d.Store.Pool.QueryRow(ctx, `SELECT count(*) FROM agents WHERE attrs @> '{"role":"gw"}'`).Scan(&n)
		return n == 3 && d.Elector.IsLeader()
	}) {
		t.Fatal("agents not registered or no leader")
	}
	cs := configs.Service{Store: d.Store}
	if _, err := cs.Put(ctx, store.ConfigDef{Name: "gateway", Type: configs.TypeYAML, Selector: map[string]string{"role": "gw"}}); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"listen: 80\n", "listen: 8080\n", "listen: 9090\n"} {
		if _, _, err := cs.AddRevision(ctx, "gateway", body, "test", ""); err != nil {
			t.Fatal(err)
		}
	}

	base := "http://" + d.HTTPAddr().String()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-background-networking", true))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	bctx, tcancel := context.WithTimeout(bctx, 2*time.Minute)
	defer tcancel()
	q := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	do := func(steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			t.Fatal(err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Text(q(sel)))
		if err != nil {
			t.Fatalf("%s: %v", sel, err)
		}
		return v
	}
	check := func(what, got, want string) {
		t.Helper()
		if !strings.Contains(got, want) {
			t.Errorf("%s: %q does not contain %q", what, got, want)
		}
	}
	// waitText reloads the page until sel contains want.
	waitText := func(url, sel, want string) string {
		t.Helper()
		var got string
		if !fleettest.Eventually(time.Minute, func() bool {
			if err := chromedp.Do(bctx, chromedp.Navigate(url), chromedp.WaitVisible(q(sel))); err != nil {
				return false
			}
			v, err := chromedp.Run(bctx, chromedp.Text(q(sel)))
			got = v
			return err == nil && strings.Contains(got, want)
		}) {
			t.Fatalf("%s %s: %q, want %q", url, sel, got, want)
		}
		return got
	}

	do(chromedp.Navigate(base+"/ui/login"), chromedp.WaitVisible(q("#login-form")),
		chromedp.SendKeys(q("#token"), tok), chromedp.Click(q("#login-submit")), chromedp.WaitVisible(q("#count-total")))
	// The configuration list, the configuration, a diff.
	do(chromedp.Click(q("#nav-configs")), chromedp.WaitVisible(q("#configs tr.config")))
	check("config list", text("#configs"), "role=gw")
	check("git sources", text("#gitops"), "not configured")
	do(chromedp.Click(q("#configs tr.config a")), chromedp.WaitVisible(q("#revisions")))
	check("revisions", text("#revisions"), "3")
	check("latest revision", text("#revision-content"), "listen: 9090")
	do(chromedp.SetValue(q("#diff-from"), "1"), chromedp.SetValue(q("#diff-to"), "2"), chromedp.Click(q("#diff-show")), chromedp.WaitVisible(q("#diff")))
	check("diff", text("#diff"), "-listen: 80\n+listen: 8080")
	// Revision 0 is the empty document.
	do(chromedp.SetValue(q("#diff-from"), "0"), chromedp.SetValue(q("#diff-to"), "1"), chromedp.Click(q("#diff-show")), chromedp.WaitVisible(q("#diff")))
	check("diff from 0", text("#diff"), "+++ gateway revision 1\n@@ -0,0 +1 @@\n+listen: 80")

	// The Plan button shows the dry run and starts nothing.
	do(chromedp.SetValue(q("#ro-to"), "1"), chromedp.SetValue(q("#ro-waves"), "1,100%"), chromedp.SetValue(q("#ro-order"), "standbys-first"),
		chromedp.Click(q("#ro-plan")), chromedp.WaitVisible(q("#rollout-plan")))
	plan := text("#rollout-plan")
	check("plan", plan, "Revision 1 of gateway, order standbys-first, 2 wave(s).")
	check("plan", plan, ags[1].UIDString()[:8])
	if n, _ := d.API.Rollouts().List(ctx, "", 10); len(n) != 0 {
		t.Fatalf("the plan started a rollout: %+v", n)
	}
	do(chromedp.SetValue(q("#ro-order"), "uid"))

	// A bad form is refused with the rule; a good one starts a rollout to
	// revision 1 that runs to the end.
	do(chromedp.SetValue(q("#ro-to"), "1"), chromedp.SetValue(q("#ro-waves"), "1,50%"), chromedp.Click(q("#ro-create")), chromedp.WaitVisible(q("#form-error")))
	check("form error", text("#form-error"), `the last wave must be "100%"`)
	do(chromedp.SetValue(q("#ro-to"), "1"), chromedp.SetValue(q("#ro-waves"), "1,100%"), chromedp.SetValue(q("#ro-bake"), "0s"),
		chromedp.Click(q("#ro-create")), chromedp.WaitVisible(q("#rollout-state")))
	var loc string
	if loc, err = chromedp.Run(bctx, chromedp.Location()); err != nil {
		t.Fatal(err)
	}
	waitText(loc+"?refresh=0", "#rollout-state", "succeeded")
	// A finished rollout no longer reloads.
	check("waves", text("#waves"), "100 %")
	check("agents", text("#rollout-agents"), ags[0].UIDString()[:8])
	check("wave", text("#rollout-wave"), "2 of 2")
	// Preview revision 2 against what the agents run now (revision 1).
	do(chromedp.Navigate(base+"/ui/configs/gateway"), chromedp.WaitVisible(q("#preview-form")),
		chromedp.SetValue(q("#preview-rev"), "2"), chromedp.Click(q("#preview-show")), chromedp.WaitVisible(q("#preview")))
	pv := text("#preview")
	check("preview", pv, "3 agent(s) running")
	check("preview", pv, "-listen: 80\n+listen: 8080")

	// Rollout to revision 2 with a long bake: it waits at the first gate.
	do(chromedp.Navigate(base+"/ui/configs/gateway"), chromedp.WaitVisible(q("#rollout-form")),
		chromedp.SetValue(q("#ro-to"), "2"), chromedp.SetValue(q("#ro-waves"), "1,100%"), chromedp.SetValue(q("#ro-bake"), "10m"),
		chromedp.Click(q("#ro-create")), chromedp.WaitVisible(q("#rollout-state")))
	if loc, err = chromedp.Run(bctx, chromedp.Location()); err != nil {
		t.Fatal(err)
	}
	waitText(loc+"?refresh=0", "#rollout-counts", "applied 1")
	do(chromedp.Navigate(loc), chromedp.WaitVisible(q("#rollout-state")))
	// The live page reloads itself; the buttons are clicked on a still copy.
	check("live", text("#live"), "reloads every 2 s")
	still := loc + "?refresh=0"
	// command clicks a button of the still page and waits until its form's
	// POST redirected back to the (live) page.
	command := func(button string) {
		t.Helper()
		do(chromedp.Navigate(still), chromedp.Click(q(button)))
		if !fleettest.Eventually(30*time.Second, func() bool {
			l, err := chromedp.Run(bctx, chromedp.Location())
			return err == nil && l == loc
		}) {
			t.Fatalf("%s: the form was not submitted", button)
		}
	}
	command("#action-pause")
	waitText(still, "#rollout-state", "paused")
	command("#action-resume")
	waitText(still, "#rollout-state", "running")
	command("#action-rollback")
	waitText(loc, "#rollout-state", "rolled_back")
	// The list shows both; the agent page shows its revision.
	do(chromedp.Click(q("#nav-rollouts")), chromedp.WaitVisible(q("#rollouts tr.rollout")))
	list := text("#rollouts")
	check("rollout list", list, "rolled_back")
	check("rollout list", list, "succeeded")
	do(chromedp.Navigate(base+"/ui/agents/"+ags[0].UIDString()), chromedp.WaitVisible(q("#assignment")))
	check("assigned", text("#assigned-config"), "gateway")
	// Back on revision 1 by the rollback of the second rollout.
	desired := waitText(base+"/ui/agents/"+ags[0].UIDString(), "#desired-revision", "· applied")
	check("desired", desired, "gateway revision 1 by rollout ")
	check("intents", text("#intents"), "apply")
	bcancel()
	acancel()
}
