package rollout_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/fleet/api"
	"github.com/myriarch/myriarch/internal/fleet/config"
	"github.com/myriarch/myriarch/internal/fleet/daemon"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestWaveSizes(t *testing.T) {
	for _, c := range []struct {
		waves []string
		n     int
		want  []int
	}{
		{[]string{"1", "10%", "50%", "100%"}, 100, []int{1, 9, 40, 50}},
		{[]string{"1", "10%", "50%", "100%"}, 3, []int{1, 1, 1}},
		{[]string{"1", "10%", "50%", "100%"}, 1, []int{1}},
		{[]string{"5", "100%"}, 3, []int{3}},
		{[]string{"25%", "100%"}, 10, []int{3, 7}},
		{[]string{"100%"}, 7, []int{7}},
	} {
		got := rollout.Spec{Waves: c.waves}.WaveSizes(c.n)
		if !slices.Equal(got, c.want) {
			t.Errorf("waves %q of %d agents: %v, want %v", c.waves, c.n, got, c.want)
		}
	}
}

func TestSpecValidate(t *testing.T) {
	bad := []struct {
		spec rollout.Spec
		want string
	}{
		{rollout.Spec{Waves: []string{"10%", "50%"}}, `the last wave must be "100%"`},
		{rollout.Spec{Waves: []string{"50%", "10%", "100%"}}, `waves[1] "10%": percentages must increase`},
		{rollout.Spec{Waves: []string{"10%", "2", "100%"}}, "an absolute number of agents must come before"},
		{rollout.Spec{Waves: []string{"0", "100%"}}, `waves[0] "0": must be a number of agents`},
		{rollout.Spec{FailurePolicy: "retry"}, `failure_policy "retry": must be pause or rollback`},
		{rollout.Spec{MaxInProgress: -1}, "max_in_progress -1: must be within [1, 100000]"},
		{rollout.Spec{BakeS: rollout.Secs(-1)}, "bake_s -1: must be within [0, 86400] seconds"},
		{rollout.Spec{MaxFailedPercent: 120}, "max_failed_percent 120"},
		{rollout.Spec{Order: "random"}, `order "random": must be uid or standbys-first`},
	}
	for _, b := range bad {
		err := b.spec.WithDefaults().Validate()
		if err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%+v: %v, want an error containing %q", b.spec, err, b.want)
		}
	}
	if err := (rollout.Spec{}).WithDefaults().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

const secret = "0123456789abcdef-secret"

type env struct {
	t     *testing.T
	d     *daemon.Daemon
	base  string
	token string
	ctx   context.Context
}

func startDaemon(t *testing.T) *env {
	t.Helper()
	pg := pgtest.New(t)
	cfg, err := config.Load(config.Source{Environ: []string{}, Overrides: map[string]string{
		"database.url": pg.DSN(""), "server.enrollmentSecret": secret, "ha.replicaId": "replica-r",
		"server.opampListen": "127.0.0.1:0", "server.httpListen": "127.0.0.1:0", "ha.leaderSessionTimeout": "10s",
		"ha.heartbeatInterval": "1s", "server.lastSeenFlushInterval": "200ms", "jobs.rolloutInterval": "100ms",
		"agents.reconcileInterval": "1s",
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	d, err := daemon.Start(sctx, daemon.Options{Config: cfg, Log: slog.New(slog.DiscardHandler), Version: "test"})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Shutdown() })
	tok, err := d.Store.CreateToken(ctx, "ops")
	if err != nil {
		t.Fatal(err)
	}
	if !fleettest.Eventually(30*time.Second, d.Elector.IsLeader) {
		t.Fatal("no leader")
	}
	return &env{t: t, d: d, base: "http://" + d.HTTPAddr().String(), token: tok, ctx: ctx}
}

// call makes an API request and decodes the answer into out (if not nil).
func (e *env) call(method, path string, body any, out any) int {
	e.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, e.base+path, rd)
	req.Header.Set("Authorization", "Bearer "+e.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			e.t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, b, err)
		}
	}
	if resp.StatusCode >= 300 {
		e.t.Logf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	return resp.StatusCode
}

func (e *env) agents(n int, attrs map[string]string, failWhen string) []*fleettest.Agent {
	return e.agentsWith(n, fleettest.AgentOptions{Attrs: attrs, FailWhen: failWhen})
}

func (e *env) agentsWith(n int, o fleettest.AgentOptions) []*fleettest.Agent {
	e.t.Helper()
	var out []*fleettest.Agent
	o.URL, o.Secret = "ws://"+e.d.OpAMPAddr().String()+"/v1/opamp", secret
	for range n {
		ag, err := fleettest.StartAgent(e.ctx, o)
		if err != nil {
			e.t.Fatal(err)
		}
		e.t.Cleanup(func() { _ = ag.Stop(context.Background()) })
		out = append(out, ag)
	}
	for _, ag := range out {
		if !fleettest.Eventually(30*time.Second, func() bool {
			a, err := e.d.Store.GetAgent(e.ctx, ag.UIDString())
			return err == nil && a.Status == "online" && a.Identifying["service.name"] != ""
		}) {
			e.t.Fatalf("agent %s not registered", ag.UIDString())
		}
	}
	return out
}

func (e *env) waitState(id int64, states ...string) rollout.Detail {
	e.t.Helper()
	var d rollout.Detail
	if !fleettest.Eventually(time.Minute, func() bool {
		var err error
		d, err = e.d.API.Rollouts().Detail(e.ctx, id, 1000)
		// A state read while an operator command waits for the engine is
		// about to change (a paused rollout with a resume pending).
		return err == nil && slices.Contains(states, d.State) && d.Requested == ""
	}) {
		e.t.Fatalf("rollout %d is %s (%s), want %v: %+v", id, d.State, d.Reason, states, d.Counts)
	}
	return d
}

// checkWaveOrder checks the history: each agent was sent the revision
// once, waves were sent in order, and no agent of wave w+1 was sent before
// the gate of wave w passed.
func (e *env) checkWaveOrder(d rollout.Detail, kind string) []rollout.Intent {
	e.t.Helper()
	in, err := e.d.API.Rollouts().Intents(e.ctx, d.ID)
	if err != nil {
		e.t.Fatal(err)
	}
	seen := map[string]bool{}
	last := 0
	gate := map[int]time.Time{}
	for _, w := range d.WaveProgress {
		if w.GatePassedAt != nil {
			gate[w.Wave] = *w.GatePassedAt
		}
	}
	var out []rollout.Intent
	for _, x := range in {
		if x.Kind != kind {
			continue
		}
		out = append(out, x)
		if seen[x.InstanceUID] {
			e.t.Errorf("agent %s sent twice", x.InstanceUID)
		}
		seen[x.InstanceUID] = true
		if x.Wave < last {
			e.t.Errorf("intent %d of wave %d after one of wave %d", x.ID, x.Wave, last)
		}
		last = x.Wave
		if g, ok := gate[x.Wave-1]; x.Wave > 1 && (!ok || x.At.Before(g)) {
			e.t.Errorf("intent %d of wave %d at %v, before the gate of wave %d passed (%v)", x.ID, x.Wave, x.At, x.Wave-1, g)
		}
	}
	return out
}

func TestRolloutLifecycle(t *testing.T) {
	e := startDaemon(t)
	good := e.agents(8, map[string]string{"role": "edge"}, "")
	bad := e.agents(3, map[string]string{"role": "edge"}, "broken")
	other := e.agents(1, map[string]string{"role": "core"}, "")

	// Configuration and revisions; a bad selector, name and content are refused.
	if c := e.call("PUT", "/api/v1/configs/edge", map[string]any{"type": "yaml", "selector": "role=edge"}, nil); c != 201 {
		t.Fatalf("create config: %d", c)
	}
	if c := e.call("PUT", "/api/v1/configs/Bad_Name", map[string]any{"type": "yaml"}, nil); c != 400 {
		t.Errorf("bad name: %d", c)
	}
	if c := e.call("PUT", "/api/v1/configs/edge", map[string]any{"type": "yaml", "selector": "role"}, nil); c != 400 {
		t.Errorf("bad selector: %d", c)
	}
	var er api.ErrorBody
	if c := e.call("POST", "/api/v1/configs/edge/revisions", map[string]any{"content": "a: [1"}, &er); c != 422 || !strings.Contains(er.Error, "not well-formed YAML") ||
		len(er.Problems) != 1 || er.Problems[0].Line != 1 {
		t.Errorf("bad YAML: %d %+v (want 422, the error and its problem on line 1)", c, er)
	}
	var rr struct {
		Revision store.Revision
		Created  bool
	}
	if c := e.call("POST", "/api/v1/configs/edge/revisions", map[string]any{"content": "level: 1\n"}, &rr); c != 201 || rr.Revision.Revision != 1 {
		t.Fatalf("revision 1: %d %+v", c, rr)
	}
	if c := e.call("POST", "/api/v1/configs/edge/revisions", map[string]any{"content": "level: 1\n"}, &rr); c != 200 || rr.Created || rr.Revision.Revision != 1 {
		t.Errorf("unchanged content made a revision: %d %+v", c, rr)
	}
	if c := e.call("PUT", "/api/v1/configs/edge", map[string]any{"type": "myriarch-bridge", "selector": "role=edge"}, &er); c != 400 ||
		!strings.Contains(er.Error, "the type of a configuration with revisions cannot change") {
		t.Errorf("type change: %d %v", c, er)
	}

	// An offline agent is skipped at its turn.
	off := e.agents(1, map[string]string{"role": "edge"}, "")[0]
	_ = off.Stop(e.ctx)
	if !fleettest.Eventually(30*time.Second, func() bool {
		a, _ := e.d.Store.GetAgent(e.ctx, off.UIDString())
		return a.Status == "offline"
	}) {
		t.Fatal("stopped agent not offline")
	}

	// Rollout 1: nothing → revision 1, four waves.
	var ro rollout.Rollout
	spec := rollout.Spec{Waves: []string{"1", "25%", "50%", "100%"}, MaxInProgress: 2, BakeS: rollout.Secs(0.3)}
	if c := e.call("POST", "/api/v1/rollouts", rollout.Request{Config: "edge", Spec: spec}, &ro); c != 202 {
		t.Fatalf("create rollout: %d", c)
	}
	// An overlapping rollout is refused.
	if c := e.call("POST", "/api/v1/rollouts", rollout.Request{Config: "edge", Spec: spec}, &er); c != 409 {
		t.Errorf("overlapping rollout: %d %v", c, er)
	}
	d := e.waitState(ro.ID, rollout.StateSucceeded)
	if d.Counts[rollout.AgentApplied] != 11 || d.Counts[rollout.AgentSkipped] != 1 || d.Waves != 4 {
		t.Fatalf("rollout 1: %+v waves %d", d.Counts, d.Waves)
	}
	e.checkWaveOrder(d, "apply")
	for _, a := range d.Agents {
		if a.InstanceUID == off.UIDString() && (a.State != rollout.AgentSkipped || a.Detail != "offline at its turn") {
			t.Errorf("offline agent: %+v", a)
		}
	}
	var as store.Assignment
	e.call("GET", "/api/v1/agents/"+good[0].UIDString()+"/assignment", nil, &as)
	if as.Config != "edge" || as.DesiredConfig != "edge" || as.DesiredRevision != 1 || !as.InSync || as.EffectiveConfig != "level: 1\n" {
		t.Errorf("assignment: %+v", as)
	}
	// An agent that joins later gets the current revision of its
	// configuration without a rollout.
	late := e.agents(1, map[string]string{"role": "edge"}, "")[0]
	if !fleettest.Eventually(30*time.Second, func() bool {
		e.call("GET", "/api/v1/agents/"+late.UIDString()+"/assignment", nil, &as)
		return as.DesiredRevision == 1 && as.InSync
	}) {
		t.Errorf("late agent: %+v", as)
	}
	if in, err := e.d.API.Rollouts().AgentIntents(e.ctx, late.UIDString(), 10); err != nil || len(in) != 1 || in[0].Kind != "assign" || in[0].RolloutID != nil {
		t.Errorf("late agent's intents: %+v %v", in, err)
	}
	e.call("GET", "/api/v1/agents/"+other[0].UIDString()+"/assignment", nil, &as)
	if as.Config != "" || as.DesiredRevision != 0 {
		t.Errorf("agent of another role: %+v", as)
	}
	if got := other[0].Configs(); len(got) != 0 {
		t.Errorf("agent of another role got %q", got)
	}

	// Rollout 2: a revision that three agents refuse; policy rollback after
	// more than one failure.
	e.call("POST", "/api/v1/configs/edge/revisions", map[string]any{"content": "level: 2\nbroken: true\n"}, &rr)
	var df struct{ Diff string }
	e.call("GET", "/api/v1/configs/edge/diff?from=1&to=2", nil, &df)
	if !strings.Contains(df.Diff, "-level: 1\n+level: 2\n+broken: true\n") {
		t.Errorf("diff: %q", df.Diff)
	}
	spec2 := rollout.Spec{Waves: []string{"100%"}, MaxInProgress: 20, BakeS: rollout.Secs(0.2), FailurePolicy: rollout.PolicyRollback, MaxFailed: 1}
	if c := e.call("POST", "/api/v1/rollouts", rollout.Request{Config: "edge", Spec: spec2}, &ro); c != 202 || ro.FromRevision != 1 || ro.ToRevision != 2 {
		t.Fatalf("rollout 2: %d %+v", c, ro)
	}
	d = e.waitState(ro.ID, rollout.StateRolledBack)
	if d.Counts[rollout.AgentFailed] < 2 || !strings.Contains(d.Reason, "rolling back to revision 1") {
		t.Errorf("rollout 2: %+v %q", d.Counts, d.Reason)
	}
	rb := e.checkWaveOrder(d, "rollback")
	if len(rb) == 0 {
		t.Error("no rollback intents")
	}
	for _, ag := range append(append([]*fleettest.Agent{}, good...), bad...) {
		if !fleettest.Eventually(30*time.Second, func() bool {
			e.call("GET", "/api/v1/agents/"+ag.UIDString()+"/assignment", nil, &as)
			return as.DesiredRevision == 1 && as.InSync
		}) {
			t.Errorf("agent %s not back on revision 1: %+v", ag.UIDString(), as)
		}
	}

	// Rollout 3: the same broken revision with policy pause, then operator
	// commands: resume (past the acknowledged failures), pause, abort.
	spec3 := rollout.Spec{Waves: []string{"100%"}, MaxInProgress: 20, BakeS: rollout.Secs(0.2), MaxFailed: 0}
	e.call("POST", "/api/v1/rollouts", rollout.Request{Config: "edge", ToRevision: 2, Spec: spec3}, &ro)
	d = e.waitState(ro.ID, rollout.StatePaused)
	if !strings.Contains(d.Reason, "paused (failure_policy pause)") {
		t.Errorf("rollout 3 reason %q", d.Reason)
	}
	if c := e.call("POST", fmt.Sprintf("/api/v1/rollouts/%d/resume", ro.ID), nil, nil); c != 202 {
		t.Errorf("resume: %d", c)
	}
	if c := e.call("POST", fmt.Sprintf("/api/v1/rollouts/%d/bogus", ro.ID), nil, nil); c != 400 {
		t.Errorf("bogus command: %d", c)
	}
	// More failures arrive after the resume, so it pauses again or finishes.
	d = e.waitState(ro.ID, rollout.StatePaused, rollout.StateSucceeded)
	if d.State == rollout.StatePaused {
		if c := e.call("POST", fmt.Sprintf("/api/v1/rollouts/%d/abort", ro.ID), nil, nil); c != 202 {
			t.Errorf("abort: %d", c)
		}
		d = e.waitState(ro.ID, rollout.StateAborted)
	}
	if c := e.call("POST", fmt.Sprintf("/api/v1/rollouts/%d/resume", ro.ID), nil, nil); c != 409 {
		t.Errorf("resume of a finished rollout: %d", c)
	}

	// Metrics.
	mfs, err := e.d.Reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	if !names["myriarch_rollouts_active"] {
		t.Errorf("myriarch_rollouts_active missing")
	}
}

// The health gate: agents that report the revision APPLIED but turn
// unhealthy (OpAMP ComponentHealth) fail, and beyond max_failed the
// rollout rolls back; the later waves are never sent.
func TestHealthGate(t *testing.T) {
	e := startDaemon(t)
	e.agentsWith(6, fleettest.AgentOptions{Attrs: map[string]string{"role": "col"}, UnhealthyWhen: "crash"})
	cs := e.d.API.Configs()
	if _, err := cs.Put(e.ctx, store.ConfigDef{Name: "col", Type: "yaml", Selector: map[string]string{"role": "col"}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cs.AddRevision(e.ctx, "col", "pipeline: ok\n", "t", ""); err != nil {
		t.Fatal(err)
	}
	rs := e.d.API.Rollouts()
	ro, err := rs.Create(e.ctx, rollout.Request{Config: "col", Spec: rollout.Spec{Waves: []string{"100%"}, BakeS: rollout.Secs(0.2)}}, "t")
	if err != nil {
		t.Fatal(err)
	}
	e.waitState(ro.ID, rollout.StateSucceeded)
	if _, _, err := cs.AddRevision(e.ctx, "col", "pipeline: crash\n", "t", ""); err != nil {
		t.Fatal(err)
	}
	ro, err = rs.Create(e.ctx, rollout.Request{Config: "col", Spec: rollout.Spec{Waves: []string{"2", "100%"}, BakeS: rollout.Secs(1),
		FailurePolicy: rollout.PolicyRollback, MaxFailed: 1}}, "t")
	if err != nil {
		t.Fatal(err)
	}
	d := e.waitState(ro.ID, rollout.StateRolledBack)
	if d.Counts[rollout.AgentFailed] != 2 || d.Counts[rollout.AgentPending] != 4 || d.Wave != 1 {
		t.Fatalf("rollout: wave %d %+v", d.Wave, d.Counts)
	}
	for _, a := range d.Agents {
		if a.State == rollout.AgentFailed && !strings.Contains(a.Detail, "pipeline broken by the new config") {
			t.Errorf("failed agent %s: %q", a.InstanceUID, a.Detail)
		}
	}
	in, _ := rs.Intents(e.ctx, ro.ID)
	kinds := map[string]int{}
	for _, x := range in {
		kinds[x.Kind]++
		if x.Wave != 1 {
			t.Errorf("intent of wave %d sent", x.Wave)
		}
	}
	if kinds["apply"] != 2 || kinds["rollback"] != 2 {
		t.Errorf("intents: %v", kinds)
	}
}
