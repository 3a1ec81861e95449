package main

import (
	"context"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/pgleader"
)

// The leader is killed (SIGKILL) in the middle of a wave of a rollout to
// 1,000 simulated agents, which are connected to two other replicas. A
// new leader takes over and finishes the rollout, and the history of
// intents and agent reports shows that
//   - every agent was sent the revision once, and received and applied it
//     once (no agent got two revisions);
//   - intents were written in wave order, each wave only after the gate of
//     the previous one passed, and no wave was skipped;
//   - the killed leader wrote no intent after the new term began.
func TestRolloutLeaderKilledMidWave(t *testing.T) {
	const agents = 1000
	pg := pgtest.New(t)
	ctx := context.Background()
	dsn := pg.DSN("")
	common := map[string]string{
		"database.url": dsn, "server.enrollmentSecret": testSecret, "ha.leaderSessionTimeout": "10s", "ha.heartbeatInterval": "1s",
		"server.lastSeenFlushInterval": "200ms", "jobs.rolloutInterval": "300ms", "database.maxConns": "10", "agents.reconcileInterval": "2s",
	}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range common {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	k := startReplica(t, with(map[string]string{"ha.replicaId": "replica-k"}))
	if !fleettest.Eventually(time.Minute, k.leads) {
		t.Fatal("K does not lead")
	}
	f := inProcessReplica(t, dsn, "replica-f", with(nil))
	g := inProcessReplica(t, dsn, "replica-g", with(nil))

	var mu sync.Mutex
	var ags []*fleettest.Agent
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for j := range agents / 4 {
				addr := f.OpAMPAddr().String()
				if (i*agents/4+j)%2 == 1 {
					addr = g.OpAMPAddr().String()
				}
				ag, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + addr + "/v1/opamp", Secret: testSecret,
					Attrs: map[string]string{"role": "fleet"}})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ags = append(ags, ag)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	defer func() {
		var wg sync.WaitGroup
		for _, ag := range ags {
			wg.Go(func() { _ = ag.Stop(ctx) })
		}
		wg.Wait()
	}()
	if t.Failed() {
		t.FailNow()
	}
	countSQL := func(sql string, args ...any) int {
		t.Helper()
		var n int
		if err := f.Store.Pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if !fleettest.Eventually(time.Minute, func() bool {
		return countSQL(`SELECT count(*) FROM agents WHERE status = 'online' AND attrs @> '{"role":"fleet"}'`) == agents
	}) {
		t.Fatalf("only %d agents registered", countSQL(`SELECT count(*) FROM agents WHERE status = 'online'`))
	}

	cs := configs.Service{Store: f.Store}
	if _, err := cs.Put(ctx, store.ConfigDef{Name: "fleet", Type: configs.TypeYAML, Selector: map[string]string{"role": "fleet"}}); err != nil {
		t.Fatal(err)
	}
	rev, _, err := cs.AddRevision(ctx, "fleet", "pipeline: v2\n", "test", "")
	if err != nil {
		t.Fatal(err)
	}
	rs := rollout.Service{Store: f.Store}
	ro, err := rs.Create(ctx, rollout.Request{Config: "fleet", Spec: rollout.Spec{Waves: []string{"1", "10%", "50%", "100%"},
		MaxInProgress: 50, BakeS: rollout.Secs(1)}}, "test")
	if err != nil {
		t.Fatal(err)
	}
	var termK int64
	if err := f.Store.Pool.QueryRow(ctx, "SELECT term FROM "+pgleader.TermTable).Scan(&termK); err != nil {
		t.Fatal(err)
	}

	// Mid-wave: wave 3 (400 agents, at most 50 in progress) has started
	// and has agents still pending.
	if !fleettest.Eventually(time.Minute, func() bool {
		return countSQL(`SELECT count(*) FROM rollouts r WHERE r.id = $1 AND r.wave = 3
			AND (SELECT count(*) FROM rollout_agents WHERE rollout_id = r.id AND wave = 3 AND state <> 'pending') > 0
			AND (SELECT count(*) FROM rollout_agents WHERE rollout_id = r.id AND wave = 3 AND state = 'pending') > 150`, ro.ID) == 1
	}) {
		d, _ := rs.Detail(ctx, ro.ID, 1)
		t.Fatalf("rollout never reached the middle of wave 3: %+v %+v", d.Rollout, d.WaveProgress)
	}
	k.signal(syscall.SIGKILL)
	killedAt := time.Now()
	k.waitExit()
	sentByK := countSQL(`SELECT count(*) FROM rollout_intents WHERE rollout_id = $1`, ro.ID)

	var d rollout.Detail
	if !fleettest.Eventually(time.Minute, func() bool {
		d, err = rs.Detail(ctx, ro.ID, agents)
		return err == nil && !d.Active()
	}) {
		t.Fatalf("rollout did not finish after the kill: %+v %+v", d.Rollout, d.Counts)
	}
	t.Logf("rollout %s %v after the kill; K had sent %d agents", d.State, time.Since(killedAt).Round(time.Millisecond), sentByK)
	if d.State != rollout.StateSucceeded || d.Counts[rollout.AgentApplied] != agents {
		t.Fatalf("rollout %s (%s): %+v", d.State, d.Reason, d.Counts)
	}
	var newTerm int64
	var elected time.Time
	if err := f.Store.Pool.QueryRow(ctx, "SELECT term, elected_at FROM "+pgleader.TermTable).Scan(&newTerm, &elected); err != nil {
		t.Fatal(err)
	}
	if newTerm <= termK {
		t.Fatalf("term %d after the kill, was %d", newTerm, termK)
	}

	// The intents: one per agent, in wave order, each wave after the gate
	// of the one before, terms never going back, nothing of K's term after
	// the new term began.
	in, err := rs.Intents(ctx, ro.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(in) != agents {
		t.Fatalf("%d intents for %d agents", len(in), agents)
	}
	gate := map[int]time.Time{}
	for _, w := range d.WaveProgress {
		if w.GatePassedAt == nil {
			t.Fatalf("wave %d: gate never passed", w.Wave)
		}
		gate[w.Wave] = *w.GatePassedAt
	}
	seen := map[string]bool{}
	lastWave, lastTerm := 0, int64(0)
	terms := map[int64]int{}
	for _, x := range in {
		if seen[x.InstanceUID] {
			t.Errorf("agent %s sent twice", x.InstanceUID)
		}
		seen[x.InstanceUID] = true
		if x.Wave < lastWave || x.Wave > lastWave+1 {
			t.Errorf("intent %d of wave %d after wave %d", x.ID, x.Wave, lastWave)
		}
		if x.Term < lastTerm {
			t.Errorf("intent %d of term %d after term %d", x.ID, x.Term, lastTerm)
		}
		if x.Wave > 1 && x.At.Before(gate[x.Wave-1]) {
			t.Errorf("intent %d of wave %d before the gate of wave %d", x.ID, x.Wave, x.Wave-1)
		}
		if x.Term == termK && !x.At.Before(elected) {
			t.Errorf("intent %d of the killed leader's term %d at %v, after term %d began at %v", x.ID, termK, x.At, newTerm, elected)
		}
		lastWave, lastTerm = x.Wave, x.Term
		terms[x.Term]++
	}
	if terms[termK] == 0 || terms[newTerm] == 0 || terms[termK]+terms[newTerm] != agents {
		t.Errorf("intents by term: %v (old %d, new %d)", terms, termK, newTerm)
	}

	// The agents: each received exactly the one revision; the reports
	// (config_applied events) show one application each.
	for _, ag := range ags {
		if got := ag.Configs(); !slices.Equal(got, []string{rev.Content}) {
			t.Fatalf("agent %s received %q", ag.UIDString(), got)
		}
	}
	if !fleettest.Eventually(30*time.Second, func() bool {
		return countSQL(`SELECT count(DISTINCT instance_uid) FROM agent_events WHERE kind = 'config_applied' AND detail LIKE $1 || '%'`, rev.Hash) == agents
	}) {
		t.Fatal("not every agent reported the revision applied")
	}
	if n := countSQL(`SELECT count(*) FROM (SELECT instance_uid FROM agent_events WHERE kind = 'config_sent' GROUP BY 1 HAVING count(*) > 1) x`); n != 0 {
		t.Errorf("%d agents were sent a config more than once", n)
	}
	if n := countSQL(`SELECT count(*) FROM (SELECT instance_uid FROM agent_events WHERE kind = 'config_applied' GROUP BY 1 HAVING count(*) > 1) x`); n != 0 {
		t.Errorf("%d agents applied a config more than once", n)
	}
}
