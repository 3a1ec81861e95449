package rollout_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// bridgeAgent inserts an online agent as the OpAMP server stores a
// myriarch-bridge: its bridge id (non-identifying) and one session per
// role in its health.
func bridgeAgent(t *testing.T, p *pgxpool.Pool, uid, bridge string, roles ...string) {
	t.Helper()
	comps := map[string]any{}
	for i, r := range roles {
		comps[fmt.Sprintf("session/s%d", i+1)] = map[string]any{"healthy": true, "status": "role=" + r + " lease_version=1"}
	}
	health, _ := json.Marshal(map[string]any{"healthy": true, "components": comps})
	nonID := map[string]string{}
	if bridge != "" {
		nonID[store.BridgeIDAttribute] = bridge
	}
	if _, err := p.Exec(context.Background(), `INSERT INTO agents (instance_uid, attrs, non_identifying, health, healthy) VALUES ($1, '{"role": "bridge"}', $2, $3, true)`,
		uid, nonID, health); err != nil {
		t.Fatal(err)
	}
}

func report(t *testing.T, p *pgxpool.Pool, status, hash string, uids ...string) {
	t.Helper()
	if _, err := p.Exec(context.Background(), `UPDATE agents SET remote_config_status = $1, remote_config_hash = $2 WHERE instance_uid = ANY($3)`,
		status, hash, uids); err != nil {
		t.Fatal(err)
	}
}

// Wave order standbys-first: the plan puts every owner after the standbys
// and the agents without roles (which keep the uid order), and the engine
// sends an owner the revision only once a standby of its bridge applied
// it and is healthy; an owner whose standbys all failed is not sent it.
func TestStandbysFirstOrderAndOwnerHold(t *testing.T) {
	ctx, st, el := fleettest.LeaderStore(t, 8)
	p := st.Pool
	bridgeAgent(t, p, "a-owner", "br1", store.RoleOwner)
	bridgeAgent(t, p, "b-standby", "br1", store.RoleStandby)
	bridgeAgent(t, p, "c-plain", "")
	bridgeAgent(t, p, "d-owner", "br2", store.RoleOwner)
	bridgeAgent(t, p, "e-standby", "br2", store.RoleStandby)
	cs := configs.Service{Store: st}
	if _, err := cs.Put(ctx, store.ConfigDef{Name: "bridges", Type: "yaml", Selector: map[string]string{"role": "bridge"}}); err != nil {
		t.Fatal(err)
	}
	rev, _, err := cs.AddRevision(ctx, "bridges", "routes: 2\n", "t", "")
	if err != nil {
		t.Fatal(err)
	}
	rs := rollout.Service{Store: st}
	req := rollout.Request{Config: "bridges", Spec: rollout.Spec{Waves: []string{"100%"}, BakeS: rollout.Secs(0), MaxFailed: 5, Order: rollout.OrderStandbysFirst}}

	// The dry run: the order, the roles, nothing stored.
	plan, err := rs.Plan(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, a := range plan.Waves[0].Agents {
		order = append(order, a.UID)
	}
	if want := []string{"b-standby", "c-plain", "e-standby", "a-owner", "d-owner"}; !slices.Equal(order, want) || plan.Order != rollout.OrderStandbysFirst ||
		plan.Waves[0].Agents[3].BridgeID != "br1" || !slices.Equal(plan.Waves[0].Agents[3].Roles, []string{"owner"}) {
		t.Fatalf("plan: %v, want %v: %+v", order, want, plan)
	}
	if l, _ := rs.List(ctx, "", 10); len(l) != 0 {
		t.Fatalf("the plan stored a rollout: %+v", l)
	}
	if _, err := rs.Plan(ctx, rollout.Request{Config: "bridges", Spec: rollout.Spec{Order: "owners-last"}}); err == nil ||
		!strings.Contains(err.Error(), `order "owners-last": must be uid or standbys-first`) {
		t.Fatalf("unknown order: %v", err)
	}

	ro, err := rs.Create(ctx, req, "t")
	if err != nil {
		t.Fatal(err)
	}
	eng := &rollout.Engine{Store: st}
	step := func() rollout.Detail {
		t.Helper()
		if err := eng.Run(ctx, el.InTerm); err != nil {
			t.Fatal(err)
		}
		d, err := rs.Detail(ctx, ro.ID, 100)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	states := func(d rollout.Detail) map[string]string {
		m := map[string]string{}
		for _, a := range d.Agents {
			m[a.InstanceUID] = a.State
		}
		return m
	}
	d := step()
	if s := states(d); s["a-owner"] != rollout.AgentPending || s["d-owner"] != rollout.AgentPending || s["b-standby"] != rollout.AgentInProgress ||
		s["e-standby"] != rollout.AgentInProgress || s["c-plain"] != rollout.AgentInProgress {
		t.Fatalf("first step: owners must wait for their standbys: %v", s)
	}
	for _, a := range d.Agents {
		if a.InstanceUID == "a-owner" && (a.BridgeID != "br1" || !slices.Equal(a.Roles, []string{"owner"})) {
			t.Errorf("rollout agent columns: %+v", a)
		}
	}
	// br1's standby applies; br2's fails.
	report(t, p, "applied", rev.Hash, "b-standby", "c-plain")
	report(t, p, "failed", rev.Hash, "e-standby")
	d = step()
	s := states(d)
	if s["a-owner"] != rollout.AgentInProgress || s["d-owner"] != rollout.AgentFailed {
		t.Fatalf("after the standbys reported: %v", s)
	}
	for _, a := range d.Agents {
		if a.InstanceUID == "d-owner" && !strings.Contains(a.Detail, "no standby of bridge br2 is healthy on the revision") {
			t.Errorf("d-owner: %q", a.Detail)
		}
	}
	in, err := rs.Intents(ctx, ro.ID)
	if err != nil {
		t.Fatal(err)
	}
	var sent []string
	for _, x := range in {
		sent = append(sent, x.InstanceUID)
	}
	if slices.Index(sent, "a-owner") < slices.Index(sent, "b-standby") || slices.Contains(sent, "d-owner") {
		t.Fatalf("intents: %v", sent)
	}
	report(t, p, "applied", rev.Hash, "a-owner")
	if d = step(); d.State != rollout.StateSucceeded {
		t.Fatalf("rollout: %s %q %v", d.State, d.Reason, states(d))
	}
}
