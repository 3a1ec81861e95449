package upgrades_test

import (
	"strings"
	"testing"

	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/upgrades"
)

// The gate rule of the rollout engine holds for package versions too: a
// canary whose install failed inside max_failed 1 does not open the next
// wave; the failure policy applies and the other agents are never offered
// the version.
func TestPackageGateNeedsAnAgentThatHeld(t *testing.T) {
	ctx, st, el := fleettest.LeaderStore(t, 8)
	p := st.Pool
	exec(t, p, `INSERT INTO package_sources (name, type, source, poll_interval_ms, last_polled_at) VALUES ('otelcol', 'oci', 'r/x', 60000, now())`)
	exec(t, p, `INSERT INTO package_releases (package, version, published_at, term) VALUES ('otelcol', 'v2.0.0', now(), 1)`)
	exec(t, p, `INSERT INTO package_assets (package, version, name, digest, size, url) VALUES ('otelcol', 'v2.0.0', 'otelcol.tgz', 'sha256:aa', 10, 'r/x@sha256:aa')`)
	exec(t, p, `INSERT INTO artifact_blobs (digest, size, term) VALUES ('sha256:aa', 10, 1)`)
	for _, uid := range []string{"a1", "a2", "a3"} {
		exec(t, p, `INSERT INTO agents (instance_uid, capabilities, attrs) VALUES ($1, 8, '{"ring": "prod"}')`, uid)
	}
	ro, err := upgrades.Create(ctx, p, "otelcol", "v2.0.0", rollout.Spec{BakeS: rollout.Secs(0), MaxFailed: 1, ApplyTimeoutS: 600}, "test")
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
	step() // plan: three waves of one
	step() // the canary a1
	report(t, p, "a1", "", "", "PackageStatusEnum_InstallFailed", "disk full")
	step()
	step()
	s, reason, w := rolloutState(t, p, ro.ID)
	if s != upgrades.StatePaused || w != 0 || !strings.Contains(reason, "wave 1: no agent applied the version and stayed healthy") {
		t.Fatalf("after the canary failed: %s wave %d %q", s, w, reason)
	}
	if ag := agents(t, p, ro.ID); ag["a2"].state != upgrades.AgentPending || ag["a3"].state != upgrades.AgentPending {
		t.Fatalf("agents after the canary failed: %+v", ag)
	}
}
