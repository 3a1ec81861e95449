package upgrades_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/upgrades"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func exec(t *testing.T, pool *pgxpool.Pool, q string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

type agentView struct{ state, hash, err string }

func agents(t *testing.T, pool *pgxpool.Pool, id int64) map[string]agentView {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT instance_uid, state, offered_hash, error FROM package_rollout_agents WHERE rollout_id = $1`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	m := map[string]agentView{}
	for rows.Next() {
		var uid string
		var v agentView
		if err := rows.Scan(&uid, &v.state, &v.hash, &v.err); err != nil {
			t.Fatal(err)
		}
		m[uid] = v
	}
	return m
}

func report(t *testing.T, pool *pgxpool.Pool, uid, version, hash, status, msg string) {
	t.Helper()
	exec(t, pool, `UPDATE agents SET package_statuses = jsonb_build_object('packages', jsonb_build_object('otelcol',
		jsonb_build_object('agent_has_version', $2::text, 'agent_has_hash', $3::text, 'status', $4::text, 'error', $5::text))) WHERE instance_uid = $1`,
		uid, version, hash, status, msg)
}

func rolloutState(t *testing.T, pool *pgxpool.Pool, id int64) (string, string, int) {
	t.Helper()
	var state, reason string
	var wave int
	if err := pool.QueryRow(context.Background(), `SELECT state, reason, wave FROM package_rollouts WHERE id = $1`, id).Scan(&state, &reason, &wave); err != nil {
		t.Fatal(err)
	}
	return state, reason, wave
}

// The engine's steps, with the agents' reports written as the OpAMP server
// stores them: waves behind the gate, a failed install pausing the
// rollout, a resume forgiving it, and the operator's abort.
func TestEngineStepsWavesPauseResumeAndAbort(t *testing.T) {
	ctx, st, el := fleettest.LeaderStore(t, 8)
	p := st.Pool
	exec(t, p, `INSERT INTO package_sources (name, type, source, poll_interval_ms, last_polled_at) VALUES ('otelcol', 'oci', 'r/x', 60000, now())`)
	exec(t, p, `INSERT INTO package_releases (package, version, published_at, term) VALUES ('otelcol', 'v2.0.0', now(), 1)`)
	exec(t, p, `INSERT INTO package_assets (package, version, name, digest, size, url) VALUES ('otelcol', 'v2.0.0', 'otelcol.tgz', 'sha256:aa', 10, 'r/x@sha256:aa')`)
	exec(t, p, `INSERT INTO artifact_blobs (digest, size, term) VALUES ('sha256:aa', 10, 1)`)
	for _, uid := range []string{"a1", "a2", "a3"} {
		exec(t, p, `INSERT INTO agents (instance_uid, capabilities, attrs) VALUES ($1, 8, '{"ring": "prod"}')`, uid)
	}
	exec(t, p, `INSERT INTO agents (instance_uid, capabilities, attrs) VALUES ('no-packages', 0, '{"ring": "prod"}')`)

	if _, err := upgrades.Create(ctx, p, "otelcol", "v9.9.9", rollout.Spec{}, "test"); err == nil || !strings.Contains(err.Error(), `version "v9.9.9"`) {
		t.Fatalf("unknown version: %v", err)
	}
	ro, err := upgrades.Create(ctx, p, "otelcol", "v2.0.0", rollout.Spec{Waves: []string{"1", "100%"}, BakeS: rollout.Secs(0), ApplyTimeoutS: 600,
		Selector: map[string]string{"ring": "prod"}}, "test")
	if err != nil {
		t.Fatal(err)
	}
	eng := &upgrades.Engine{Pool: p}
	step := func() {
		t.Helper()
		if err := eng.Run(ctx, el.InTerm); err != nil {
			t.Fatal(err)
		}
	}
	step() // plan
	if s, _, _ := rolloutState(t, p, ro.ID); s != upgrades.StateRunning || len(agents(t, p, ro.ID)) != 3 {
		t.Fatalf("planned: %s %+v (the agent without AcceptsPackages is left out)", s, agents(t, p, ro.ID))
	}
	// The step wrote in the job's term, and says so (rollout.RunSteps).
	var term int64
	if err := p.QueryRow(ctx, `SELECT term FROM package_rollouts WHERE id = $1`, ro.ID).Scan(&term); err != nil || term != el.Term() {
		t.Fatalf("term of the planned rollout: %d (%v), the job's is %d", term, err, el.Term())
	}
	step() // wave 0: the canary a1
	ag := agents(t, p, ro.ID)
	if ag["a1"].state != upgrades.AgentInProgress || ag["a1"].hash == "" || ag["a2"].state != upgrades.AgentPending {
		t.Fatalf("wave 0: %+v", ag)
	}
	var offers int
	_ = p.QueryRow(ctx, `SELECT count(*) FROM agent_package_offers WHERE version = 'v2.0.0'`).Scan(&offers)
	if offers != 1 {
		t.Fatalf("offers: %d", offers)
	}
	// A report of another hash does not count.
	report(t, p, "a1", "v2.0.0", "0000", "PackageStatusEnum_Installed", "")
	step()
	if agents(t, p, ro.ID)["a1"].state != upgrades.AgentInProgress {
		t.Fatal("installed with the wrong hash counted")
	}
	report(t, p, "a1", "v2.0.0", ag["a1"].hash, "PackageStatusEnum_Installed", "")
	step() // a1 installed; bake 0: the gate opens wave 1
	if _, _, w := rolloutState(t, p, ro.ID); w != 1 {
		t.Fatalf("wave after the gate: %d", w)
	}
	step() // wave 1: a2, a3
	if got := testutil.CollectAndCount(upgrades.Collector{Pool: p}, "myriarch_package_rollout_agents"); got != len(upgrades.AgentStates) {
		t.Fatalf("agent series: %d", got)
	}
	if err := testutil.CollectAndCompare(upgrades.Collector{Pool: p}, strings.NewReader(`
# HELP myriarch_package_rollout_wave Current wave of the package rollout (1-based; 0 before it is planned).
# TYPE myriarch_package_rollout_wave gauge
myriarch_package_rollout_wave{package="otelcol",rollout="1"} 2
`), "myriarch_package_rollout_wave"); err != nil {
		t.Fatal(err)
	}
	ag = agents(t, p, ro.ID)
	if ag["a2"].state != upgrades.AgentInProgress || ag["a3"].state != upgrades.AgentInProgress {
		t.Fatalf("wave 1: %+v", ag)
	}
	report(t, p, "a2", "", "", "PackageStatusEnum_InstallFailed", "content hash mismatch")
	step()
	if s, reason, _ := rolloutState(t, p, ro.ID); s != upgrades.StatePaused || !strings.Contains(reason, "1 of 3 agents failed") {
		t.Fatalf("after a failed install: %s %q", s, reason)
	}
	if a := agents(t, p, ro.ID)["a2"]; a.state != upgrades.AgentFailed || !strings.Contains(a.err, "content hash mismatch") {
		t.Fatalf("a2: %+v", a)
	}
	// Resume: the failure is forgiven; a3 installs; the rollout succeeds.
	if err := upgrades.Request(ctx, p, ro.ID, "resume"); err != nil {
		t.Fatal(err)
	}
	report(t, p, "a3", "v2.0.0", ag["a3"].hash, "PackageStatusEnum_Installed", "")
	step()
	step()
	if s, _, _ := rolloutState(t, p, ro.ID); s != upgrades.StateSucceeded {
		t.Fatalf("after the resume: %s %+v", s, agents(t, p, ro.ID))
	}
	if err := upgrades.Request(ctx, p, ro.ID, "pause"); err == nil {
		t.Fatal("command accepted for a finished rollout")
	}
	if err := upgrades.Request(ctx, p, ro.ID, "explode"); err == nil || !strings.Contains(err.Error(), `command "explode"`) {
		t.Fatalf("bad command: %v", err)
	}

	// Abort.
	ro2, err := upgrades.Create(ctx, p, "otelcol", "v2.0.0", rollout.Spec{}, "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := upgrades.Request(ctx, p, ro2.ID, "abort"); err != nil {
		t.Fatal(err)
	}
	step()
	if s, _, _ := rolloutState(t, p, ro2.ID); s != upgrades.StateAborted {
		t.Fatalf("abort: %s", s)
	}
	l, err := upgrades.List(ctx, p)
	if err != nil || len(l) != 2 || l[1].Counts[upgrades.AgentInstalled] != 2 {
		t.Fatalf("list: %v %+v", err, l)
	}
}
