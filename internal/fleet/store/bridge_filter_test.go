package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/pgtest"
)

// bridgeHealth is a bridge's health report with one session per role.
func bridgeHealth(roles ...string) json.RawMessage {
	comps := map[string]any{}
	for i, r := range roles {
		comps[fmt.Sprintf("session/s%d", i)] = map[string]any{"healthy": true, "status": "mode=exclusive role=" + r + " service_level=full"}
	}
	b, _ := json.Marshal(map[string]any{"healthy": true, "components": comps})
	return b
}

// TestSessionRolesSQLMatchesGo: the SQL twin of Agent.Roles that the
// filters use reads every health report as the Go parser does.
func TestSessionRolesSQLMatchesGo(t *testing.T) {
	pg := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := open(t, pg.DSN(""))
	reports := []string{
		`{"healthy":true,"components":{"session/b":{"healthy":true,"status":"mode=exclusive role=standby"},"session/a":{"status":"role=owner lease_version=7"},"route/x":{"status":"role=ignored"}}}`,
		`{"healthy":true,"components":{"session/a":{"status":"mode=shared role=active"},"session/b":{"status":"role=active"},"session/c":{"status":"role=stopped"}}}`,
		`{"healthy":true,"components":{"session/a":{"status":"mode=exclusive"},"session/b":{"status":"role= service_level=none"},"session/c":null}}`,
		`{"healthy":true,"components":{"session/a":{"status":"xrole=owner myrole=standby"},"session/b":{"status":"role=owner\tservice_level=full"}}}`,
		`{"healthy":true,"components":{"pipeline":{"status":"role=owner"}}}`,
		`{"healthy":true}`,
		`{"healthy":true,"components":[]}`,
		`"ready"`,
		// A repeated key: the first counts. Unicode spaces do not split.
		`{"healthy":true,"components":{"session/a":{"status":"role=owner role=standby"}}}`,
		`{"healthy":true,"components":{"session/a":{"status":"role=standby\u00a0x"},"session/b":{"status":"a=b\u2003role=owner"},"session/c":{"status":"x=1\u000brole=stopped"}}}`,
	}
	for i, h := range append(reports, "") {
		uid := fmt.Sprintf("a%02d", i)
		if _, err := s.Connected(ctx, uid, "r1", "c", time.Now()); err != nil {
			t.Fatal(err)
		}
		if h != "" {
			if err := s.UpdateState(ctx, uid, "c", State{Health: json.RawMessage(h)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	agents, _, err := s.ListAgents(ctx, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		var sqlRoles []string
		if err := s.Pool.QueryRow(ctx, "SELECT "+SessionRolesSQL+" FROM agents WHERE instance_uid = $1", a.InstanceUID).Scan(&sqlRoles); err != nil {
			t.Fatal(err)
		}
		goRoles := a.Roles()
		if goRoles == nil {
			goRoles = []string{}
		}
		if !slices.Equal(sqlRoles, goRoles) {
			t.Errorf("%s %s: SQL roles %q, Go roles %q", a.InstanceUID, a.Health, sqlRoles, goRoles)
		}
	}
}

// TestListAgentsByBridgeAndRole: the bridge id and role filters select in
// the database and page like the other filters, alone and together.
func TestListAgentsByBridgeAndRole(t *testing.T) {
	pg := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := open(t, pg.DSN(""))
	// Five bridge pairs p0..p4: the even uid owns, the odd one stands by;
	// p4's second process owns one session and stands by for another.
	// Plus two plain agents.
	type row struct {
		uid, bridge string
		roles       []string
	}
	var rows []row
	for p := range 5 {
		rows = append(rows, row{fmt.Sprintf("b%d-0", p), fmt.Sprintf("p%d", p), []string{RoleOwner}},
			row{fmt.Sprintf("b%d-1", p), fmt.Sprintf("p%d", p), []string{RoleStandby}})
	}
	rows[9].roles = []string{RoleStandby, RoleOwner}
	rows = append(rows, row{"x1", "", nil}, row{"x2", "", nil})
	for _, r := range rows {
		if _, err := s.Connected(ctx, r.uid, "r1", "c", time.Now()); err != nil {
			t.Fatal(err)
		}
		st := State{Identifying: map[string]string{"service.name": "myriarch-bridge"}, NonIdentifying: map[string]string{}}
		if r.bridge != "" {
			st.NonIdentifying[BridgeIDAttribute] = r.bridge
			st.Health = bridgeHealth(r.roles...)
		}
		if err := s.UpdateState(ctx, r.uid, "c", st); err != nil {
			t.Fatal(err)
		}
	}
	// all pages through the filter two agents at a time.
	all := func(f Filter) []string {
		t.Helper()
		f.Limit = 2
		var uids []string
		for pages := 0; ; pages++ {
			page, next, err := s.ListAgents(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) > 2 || pages > 10 {
				t.Fatalf("page of %d, %d pages", len(page), pages)
			}
			for _, a := range page {
				uids = append(uids, a.InstanceUID)
			}
			if next == "" {
				return uids
			}
			f.After = next
		}
	}
	for _, c := range []struct {
		f    Filter
		want []string
	}{
		{Filter{Role: RoleOwner}, []string{"b0-0", "b1-0", "b2-0", "b3-0", "b4-0", "b4-1"}},
		{Filter{Role: RoleStandby}, []string{"b0-1", "b1-1", "b2-1", "b3-1", "b4-1"}},
		{Filter{BridgeID: "p2"}, []string{"b2-0", "b2-1"}},
		{Filter{BridgeID: "p4", Role: RoleOwner}, []string{"b4-0", "b4-1"}},
		{Filter{BridgeID: "p3", Role: RoleOwner}, []string{"b3-0"}},
		{Filter{BridgeID: "p3", Role: "active"}, nil},
		{Filter{BridgeID: "nope"}, nil},
		{Filter{Role: RoleStandby, Selector: map[string]string{"service.name": "myriarch-bridge"}, Status: "online"}, []string{"b0-1", "b1-1", "b2-1", "b3-1", "b4-1"}},
	} {
		if got := all(c.f); !slices.Equal(got, c.want) {
			t.Errorf("%+v: %v, want %v", c.f, got, c.want)
		}
	}
	// The list items carry the bridge id and the roles.
	page, _, err := s.ListAgents(ctx, Filter{BridgeID: "p4"})
	if err != nil || len(page) != 2 {
		t.Fatal(page, err)
	}
	var item struct {
		BridgeID string   `json:"bridge_id"`
		Roles    []string `json:"roles"`
	}
	b, _ := json.Marshal(page[1])
	if err := json.Unmarshal(b, &item); err != nil || item.BridgeID != "p4" || !slices.Equal(item.Roles, []string{RoleOwner, RoleStandby}) {
		t.Errorf("list item %s: %+v %v", b, item, err)
	}
	plain, err := s.GetAgent(ctx, "x1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = json.Marshal(plain)
	if err := json.Unmarshal(b, &item); err != nil || item.BridgeID != "" || item.Roles == nil || len(item.Roles) != 0 {
		t.Errorf("plain agent %s: %+v %v", b, item, err)
	}
}

// BenchmarkListAgentsBridgeFilters100k pages through the bridge filters of
// a fleet of 100,000 agents, 2,000 of them bridges (1,000 pairs): each
// page is selected in the database by the filters' indexes.
//
//	go test -run '^$' -bench BridgeFilters -benchtime 200x ./internal/fleet/store/
func BenchmarkListAgentsBridgeFilters100k(b *testing.B) {
	pg := pgtest.New(b)
	ctx := context.Background()
	s, err := Open(ctx, pg.DSN(""), 4, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Pool.Exec(ctx, `INSERT INTO agents (instance_uid, identifying, non_identifying, attrs, health)
		SELECT format('a%06s', i), '{"service.name":"otelcol"}', '{}', '{"service.name":"otelcol"}', '{"healthy":true,"components":{"pipeline":{"status":"ok"}}}'
		FROM generate_series(1, 98000) AS i`); err != nil {
		b.Fatal(err)
	}
	if _, err := s.Pool.Exec(ctx, `INSERT INTO agents (instance_uid, identifying, non_identifying, attrs, health)
		SELECT format('b%06s', i), '{"service.name":"myriarch-bridge"}', jsonb_build_object($1::text, 'p' || (i / 2)),
			jsonb_build_object('service.name', 'myriarch-bridge', $1::text, 'p' || (i / 2)),
			jsonb_build_object('healthy', true, 'components', jsonb_build_object('session/plant',
				jsonb_build_object('healthy', true, 'status', 'mode=exclusive role=' || CASE WHEN i % 2 = 0 THEN 'owner' ELSE 'standby' END)))
		FROM generate_series(0, 1999) AS i`, BridgeIDAttribute); err != nil {
		b.Fatal(err)
	}
	if _, err := s.Pool.Exec(ctx, "ANALYZE agents"); err != nil {
		b.Fatal(err)
	}
	// A page of owners reads the role's index in uid order, not the
	// primary key past the 98,000 other agents that come first.
	var plan []byte
	if err := s.Pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) SELECT instance_uid FROM agents WHERE instance_uid > '' AND "+
		SessionRoleSQL(RoleOwner)+" ORDER BY instance_uid LIMIT 101").Scan(&plan); err != nil || !strings.Contains(string(plan), "agents_role_owner") {
		b.Fatalf("plan of a page of owners: %s, %v", plan, err)
	}
	for _, c := range []struct {
		name string
		f    Filter
		want int
	}{
		{"bridge_id", Filter{BridgeID: "p500"}, 2},
		{"role=owner", Filter{Role: RoleOwner, Limit: 100}, 100},
		{"bridge_id+role", Filter{BridgeID: "p500", Role: RoleStandby}, 1},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				page, _, err := s.ListAgents(ctx, c.f)
				if err != nil || len(page) != c.want {
					b.Fatalf("%d agents, %v; want %d", len(page), err, c.want)
				}
			}
		})
	}
}
