package ui_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// The sequence of issue 23: a rollout gives an agent revision 1, then a
// direct PUT replaces it. The agent page and the API's agent detail say
// "direct push by <token> at <time>", not revision 1; cleared, they say
// none.
func TestDesiredSourceAfterRolloutThenDirectPush(t *testing.T) {
	const secret = "0123456789abcdef-secret" // startUI's enrollment secret
	d := startUI(t, "replica-src", map[string]string{"ha.heartbeatInterval": "1s", "server.lastSeenFlushInterval": "200ms", "jobs.rolloutInterval": "100ms"})
	ctx := context.Background()
	_, opsSecret, err := d.Store.IssueTokenRole(ctx, "ops-release", store.RoleOperator)
	if err != nil {
		t.Fatal(err)
	}
	_, pushSecret, err := d.Store.IssueTokenRole(ctx, "ci-push", store.RoleOperator)
	if err != nil {
		t.Fatal(err)
	}
	session := sessionOf(t, d, store.RoleViewer)
	ag, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + d.OpAMPAddr().String() + "/v1/opamp", Secret: secret,
		Attrs: map[string]string{"role": "gw"}})
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Stop(ctx)
	uid := ag.UIDString()
	if !fleettest.Eventually(30*time.Second, func() bool {
		_, err := d.Store.GetAgent(ctx, uid)
		return err == nil && d.Elector.IsLeader()
	}) {
		t.Fatal("agent not registered or no leader")
	}
	cs := configs.Service{Store: d.Store}
	if _, err := cs.Put(ctx, store.ConfigDef{Name: "gateway", Type: configs.TypeYAML, Selector: map[string]string{"role": "gw"}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cs.AddRevision(ctx, "gateway", "listen: 80\n", "test", ""); err != nil {
		t.Fatal(err)
	}

	base := "http://" + d.HTTPAddr().String()
	call := func(tok, method, path string, in, out any) int {
		t.Helper()
		var body bytes.Buffer
		if in != nil {
			_ = json.NewEncoder(&body).Encode(in)
		}
		req, _ := http.NewRequest(method, base+path, &body)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if out != nil {
			_ = json.NewDecoder(resp.Body).Decode(out)
		}
		return resp.StatusCode
	}
	type detail struct {
		Agent struct {
			DesiredConfig string               `json:"desired_config"`
			DesiredSource *store.DesiredSource `json:"desired_source"`
		} `json:"agent"`
	}
	get := func() detail {
		t.Helper()
		var dt detail
		if c := call(pushSecret, "GET", "/api/v1/agents/"+uid, nil, &dt); c != 200 {
			t.Fatalf("GET agent: %d", c)
		}
		return dt
	}
	ddRe := regexp.MustCompile(`(?s)<dd id="desired-revision">(.*?)</dd>`)
	tagRe := regexp.MustCompile(`<[^>]*>`)
	page := func() string {
		t.Helper()
		m := ddRe.FindStringSubmatch(getPage(t, d, session, "/ui/agents/"+uid))
		if m == nil {
			t.Fatal("agent page without #desired-revision")
		}
		return html.UnescapeString(tagRe.ReplaceAllString(m[1], ""))
	}
	stamp := func(at time.Time) string { return at.In(time.Local).Format("2006-01-02 15:04:05Z07:00") }

	// A rollout gives the agent revision 1.
	var ro rollout.Rollout
	bake := 0.0
	if c := call(opsSecret, "POST", "/api/v1/rollouts", rollout.Request{Config: "gateway",
		Spec: rollout.Spec{Waves: []string{"100%"}, MaxInProgress: 5, BakeS: &bake}}, &ro); c != http.StatusAccepted {
		t.Fatalf("create rollout: %d %+v", c, ro)
	}
	var dt detail
	if !fleettest.Eventually(30*time.Second, func() bool {
		dt = get()
		return dt.Agent.DesiredSource != nil && strings.Contains(page(), "· applied")
	}) {
		t.Fatalf("revision 1 not applied: %+v, page %q", dt.Agent.DesiredSource, page())
	}
	src := dt.Agent.DesiredSource
	if src.Kind != store.DesiredFromRevision || src.Config != "gateway" || src.Revision != 1 || src.RolloutID == nil ||
		*src.RolloutID != ro.ID || src.By != "token ops-release" || src.At.IsZero() {
		t.Fatalf("source after the rollout: %+v", src)
	}
	want := fmt.Sprintf("gateway revision 1 by rollout %d (created by token ops-release) at %s · applied", ro.ID, stamp(src.At))
	if got := page(); got != want {
		t.Fatalf("page after the rollout: %q, want %q", got, want)
	}

	// A direct push replaces it.
	before := time.Now()
	if c := call(pushSecret, "PUT", "/api/v1/agents/"+uid+"/config", map[string]string{"config": "listen: 8081\n"}, nil); c != http.StatusAccepted {
		t.Fatalf("PUT config: %d", c)
	}
	dt = get()
	src = dt.Agent.DesiredSource
	if dt.Agent.DesiredConfig != "listen: 8081\n" || src == nil || src.Kind != store.DesiredDirect || src.By != "token ci-push" ||
		src.Config != "" || src.Revision != 0 || src.RolloutID != nil || src.At.Before(before.Add(-time.Second)) || src.At.After(time.Now().Add(time.Second)) {
		t.Fatalf("after the direct push: %+v %+v", dt.Agent.DesiredConfig, src)
	}
	direct := "direct push by token ci-push at " + stamp(src.At)
	if !fleettest.Eventually(30*time.Second, func() bool { return page() == direct+" · applied" }) {
		t.Fatalf("page after the direct push: %q, want %q", page(), direct+" · applied")
	}
	var as store.Assignment
	if call(pushSecret, "GET", "/api/v1/agents/"+uid+"/assignment", nil, &as); as.DesiredConfig != "" || as.DesiredRevision != 0 || as.Config != "gateway" {
		t.Fatalf("assignment after the direct push still names a revision: %+v", as)
	}

	// Cleared: none.
	if c := call(pushSecret, "DELETE", "/api/v1/agents/"+uid+"/config", nil, nil); c != http.StatusAccepted {
		t.Fatalf("DELETE config: %d", c)
	}
	if dt = get(); dt.Agent.DesiredSource != nil {
		t.Fatalf("source after clearing: %+v", dt.Agent.DesiredSource)
	}
	if got := page(); !strings.HasPrefix(got, "none (cleared") {
		t.Fatalf("page after clearing: %q", got)
	}
}
