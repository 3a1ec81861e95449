package ui_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/fleet/ui"
)

// The agent page offers "Allow re-enrollment" to admins only, and the form
// stores the allowance (issue 21, item 1).
func TestAllowReenrollButton(t *testing.T) {
	d := startUI(t, "replica-reenroll", nil)
	ctx := context.Background()
	uid := "0f0f0f0f-0000-4000-8000-0000000000d1"
	if _, err := d.Store.Connected(ctx, uid, "elsewhere", "x#1", time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Store.IssueAgentCredential(ctx, uid); err != nil {
		t.Fatal(err)
	}
	if p := getPage(t, d, sessionOf(t, d, store.RoleOperator), "/ui/agents/"+uid); strings.Contains(p, `id="allow-reenroll"`) {
		t.Error("an operator is offered the re-enrollment button")
	}
	admin := sessionOf(t, d, store.RoleAdmin)
	if p := getPage(t, d, admin, "/ui/agents/"+uid); !strings.Contains(p, `id="allow-reenroll"`) {
		t.Fatal("an admin is not offered the re-enrollment button")
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+d.HTTPAddr().String()+"/ui/agents/"+uid+"/allow-reenroll", strings.NewReader(url.Values{}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	req.AddCookie(&http.Cookie{Name: ui.CookieName, Value: admin})
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(resp.Header.Get("Location"), "done=reenroll") {
		t.Fatalf("POST allow-reenroll: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if c, _, err := d.Store.AgentCredentialOf(ctx, uid); err != nil || c.ReenrollAllowedAt == nil || !strings.Contains(c.ReenrollAllowedBy, "t-admin") {
		t.Fatalf("allowance not stored: %+v %v", c, err)
	}
	if p := getPage(t, d, admin, "/ui/agents/"+uid+"?done=reenroll"); !strings.Contains(p, "Re-enrollment allowed") {
		t.Fatal("no notice after the allowance")
	}
}
