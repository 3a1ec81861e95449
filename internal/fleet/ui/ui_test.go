package ui_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/fleet/fleettest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// chromium finds the system browser; without one the test skips, except
// under CI=true where it fails.
func chromium(t *testing.T) string {
	for _, p := range []string{os.Getenv("CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium not found (apt-get install -y chromium); the UI test must run under CI")
	}
	t.Skip("chromium not found; install it (apt-get install -y chromium) to run the browser test")
	return ""
}

func TestUIInHeadlessChromium(t *testing.T) {
	browser := chromium(t)
	const secret = "0123456789abcdef-secret" // startUI's enrollment secret
	d := startUI(t, "replica-ui", map[string]string{"ha.heartbeatInterval": "1s", "server.lastSeenFlushInterval": "200ms", "jobs.offlineSweepInterval": "1s"})
	ctx := context.Background()
	tok, err := d.Store.CreateToken(ctx, "ui")
	if err != nil {
		t.Fatal(err)
	}
	ag, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + d.OpAMPAddr().String() + "/v1/opamp", Secret: secret,
		Attrs: map[string]string{"service.name": "bridge-ui-test"}})
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Stop(ctx)
	if !fleettest.Eventually(30*time.Second, func() bool {
		a, err := d.Store.GetAgent(ctx, ag.UIDString())
		return err == nil && a.Identifying["service.name"] == "bridge-ui-test" && d.Elector.IsLeader()
	}) {
		t.Fatal("agent not registered or no leader")
	}
	// Let the events and job runs be flushed.
	if !fleettest.Eventually(30*time.Second, func() bool {
		evs, _ := d.Store.Events(ctx, ag.UIDString(), 5)
		runs, _ := d.Store.JobRuns(ctx)
		return len(evs) > 0 && len(runs) >= 2
	}) {
		t.Fatal("no events or job runs")
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
	location := func() string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Location())
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// Every page needs a login.
	do(chromedp.Navigate(base+"/ui/agents"), chromedp.WaitVisible(q("#login-form")),
		chromedp.SendKeys(q("#token"), "myr_wrong"), chromedp.Click(q("#login-submit")), chromedp.WaitVisible(q("#login-error")))
	loginErr := text("#login-error")
	do(chromedp.SendKeys(q("#token"), tok), chromedp.Click(q("#login-submit")), chromedp.WaitVisible(q("#count-total")))
	// Overview.
	url := location()
	total, online, leader := text("#count-total"), text("#count-online"), text("#leader")
	// Agent list, then the agent's page through its link.
	do(chromedp.Click(q("#nav-agents")), chromedp.WaitVisible(q("#agents tr.agent")))
	uidCell := text("#agents tr.agent td")
	do(chromedp.Click(q("#agents tr.agent td a")), chromedp.WaitVisible(q("#agent-status")))
	status, attrs, events := text("#agent-status"), text("#attributes"), text("#events")
	// The status filter of the list.
	do(chromedp.Navigate(base+"/ui/agents?status=offline"), chromedp.WaitVisible(q("#no-agents")))
	noAgents := text("#no-agents")
	// Cluster.
	do(chromedp.Click(q("#nav-cluster")), chromedp.WaitVisible(q("#leader-id")))
	leaderID, replicas, jobs := text("#leader-id"), text("#replicas"), text("#jobs")

	check := func(what, got, want string) {
		t.Helper()
		if !strings.Contains(got, want) {
			t.Errorf("%s: %q does not contain %q", what, got, want)
		}
	}
	check("login error", loginErr, "Invalid API token")
	check("after login", url, "/ui/")
	check("total", total, "1")
	check("online", online, "1")
	check("overview leader", leader, "replica-ui")
	check("agent list", uidCell, ag.UIDString())
	check("agent status", status, "online")
	check("attributes", attrs, "bridge-ui-test")
	check("events", events, "connected")
	check("offline filter", noAgents, "No agents match")
	check("cluster leader", leaderID, "replica-ui")
	check("replicas", replicas, "holds the lock")
	check("jobs", jobs, "offline_sweeper")
	check("jobs", jobs, "housekeeping")

	// Logging out ends the session.
	do(chromedp.Click(q(".logout button")), chromedp.WaitVisible(q("#login-form")),
		chromedp.Navigate(base+"/ui/cluster"), chromedp.WaitVisible(q("#login-form")))
	after := location()
	check("after logout", after, "/ui/login")
	bcancel()
	acancel()
}
