package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// The agents list shows a bridge's id and session roles and filters by
// them, in the API (with paging) and on the page (its form and its
// columns); the agent page and the agent detail carry them too.
func TestAgentsListBridgeIDAndRoles(t *testing.T) {
	d := startUI(t, "replica-br", nil)
	ctx := context.Background()
	// Two bridge pairs and a collector, written as the OpAMP server writes
	// them.
	agents := []struct{ uid, bridge, role string }{
		{"u1", "plant-1", store.RoleOwner}, {"u2", "plant-1", store.RoleStandby},
		{"u3", "plant-2", store.RoleStandby}, {"u4", "plant-2", store.RoleOwner}, {"u5", "", ""},
	}
	for _, a := range agents {
		if _, err := d.Store.Connected(ctx, a.uid, "replica-br", "test#"+a.uid, time.Now()); err != nil {
			t.Fatal(err)
		}
		st := store.State{Identifying: map[string]string{"service.name": "otelcol"}, NonIdentifying: map[string]string{}}
		if a.bridge != "" {
			st.Identifying["service.name"] = "myriarch-bridge"
			st.NonIdentifying[store.BridgeIDAttribute] = a.bridge
			st.Health = json.RawMessage(fmt.Sprintf(`{"healthy":true,"components":{"session/plant":{"healthy":true,"status":"mode=exclusive role=%s"}}}`, a.role))
		}
		if err := d.Store.UpdateState(ctx, a.uid, "test#"+a.uid, st); err != nil {
			t.Fatal(err)
		}
	}
	_, tok, err := d.Store.IssueTokenRole(ctx, "viewer", store.RoleViewer)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + d.HTTPAddr().String()
	get := func(path string, out any) int {
		t.Helper()
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_ = json.NewDecoder(resp.Body).Decode(out)
		return resp.StatusCode
	}
	type item struct {
		UID      string   `json:"instance_uid"`
		BridgeID string   `json:"bridge_id"`
		Roles    []string `json:"roles"`
	}
	// The standbys, one per page.
	var got []item
	for after, pages := "", 0; ; pages++ {
		var page struct {
			Agents []item
			Next   string
		}
		if c := get("/api/v1/agents?kind=bridge&role=standby&limit=1&after="+after, &page); c != 200 || pages > 3 {
			t.Fatalf("page %d: %d", pages, c)
		}
		got = append(got, page.Agents...)
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	if len(got) != 2 || got[0].UID != "u2" || got[0].BridgeID != "plant-1" || !slices.Equal(got[0].Roles, []string{"standby"}) ||
		got[1].UID != "u3" || got[1].BridgeID != "plant-2" {
		t.Fatalf("standbys: %+v", got)
	}
	var detail struct{ Agent item }
	if get("/api/v1/agents/u4", &detail); detail.Agent.BridgeID != "plant-2" || !slices.Equal(detail.Agent.Roles, []string{"owner"}) {
		t.Fatalf("detail of u4: %+v", detail.Agent)
	}
	var bad struct{ Error string }
	if c := get("/api/v1/agents?role=leader", &bad); c != 400 || !strings.Contains(bad.Error, `role: "leader"`) {
		t.Fatalf("role=leader: %d %q", c, bad.Error)
	}

	session := sessionOf(t, d, store.RoleViewer)
	rowRe := regexp.MustCompile(`(?s)<tr class="agent" data-uid="([^"]+)">.*?<td class="bridge-id">(.*?)</td>\s*<td class="roles">(.*?)</td>`)
	tagRe := regexp.MustCompile(`<[^>]*>`)
	rows := func(path string) []string {
		t.Helper()
		var out []string
		for _, m := range rowRe.FindAllStringSubmatch(getPage(t, d, session, path), -1) {
			out = append(out, m[1]+" "+tagRe.ReplaceAllString(m[2], "")+" "+m[3])
		}
		return out
	}
	if r := rows("/ui/agents"); !slices.Equal(r, []string{"u1 plant-1 owner", "u2 plant-1 standby", "u3 plant-2 standby", "u4 plant-2 owner", "u5 – –"}) {
		t.Errorf("all agents: %q", r)
	}
	if r := rows("/ui/agents?bridge_id=plant-2&role=owner"); !slices.Equal(r, []string{"u4 plant-2 owner"}) {
		t.Errorf("plant-2's owner: %q", r)
	}
	page := getPage(t, d, session, "/ui/agents?bridge_id=plant-1&role=standby")
	for _, want := range []string{`id="filter-bridge-id" placeholder="bridge id" value="plant-1"`, `<option value="standby" selected>standby</option>`} {
		if !strings.Contains(page, want) {
			t.Errorf("the filter form does not keep the filter: no %s", want)
		}
	}
	if !strings.Contains(getPage(t, d, session, "/ui/agents?role=leader"), `role: &#34;leader&#34;: must be one of`) {
		t.Error("the page does not show the refused role")
	}
	agentPage := getPage(t, d, session, "/ui/agents/u2")
	if !regexp.MustCompile(`<dd id="agent-bridge-id"><a [^>]*>plant-1</a></dd>`).MatchString(agentPage) || !strings.Contains(agentPage, `<dd id="agent-roles">standby</dd>`) {
		t.Error("the agent page does not show the bridge id and roles")
	}
}
