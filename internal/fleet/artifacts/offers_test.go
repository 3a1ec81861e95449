package artifacts_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/open-telemetry/opamp-go/protobufs"

	"github.com/myriarch/myriarch/internal/fleet/artifacts"
)

// An agent that does not declare AcceptsPackages is not offered anything:
// it would ignore the offer. The error names the agent and the capability,
// and nothing is recorded.
func TestOfferRefusesAgentsThatDoNotAcceptPackages(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	const plain, pkg = "0190a1b2-0000-4000-8000-0000000000c1", "0190a1b2-0000-4000-8000-0000000000c2"
	accepts := int64(protobufs.AgentCapabilities_AgentCapabilities_ReportsStatus | protobufs.AgentCapabilities_AgentCapabilities_AcceptsPackages)
	for uid, caps := range map[string]int64{plain: int64(protobufs.AgentCapabilities_AgentCapabilities_ReportsStatus | protobufs.AgentCapabilities_AgentCapabilities_AcceptsRemoteConfig), pkg: accepts} {
		if _, err := st.Pool.Exec(ctx, `INSERT INTO agents (instance_uid, attrs, capabilities) VALUES ($1, '{"os.type":"linux","host.arch":"amd64"}', $2)`, uid, caps); err != nil {
			t.Fatal(err)
		}
	}
	_, err := artifacts.OfferVersion(ctx, st.Pool, "otelcol", "v1.0.0", []string{plain, pkg}, "test")
	if !errors.Is(err, artifacts.ErrNotOfferable) || !strings.Contains(err.Error(), plain) || !strings.Contains(err.Error(), "AcceptsPackages") ||
		!strings.Contains(err.Error(), "AcceptsRemoteConfig") {
		t.Fatalf("offer to an agent without AcceptsPackages: %v", err)
	}
	// The agent that accepts packages gets past the check (and stops at the
	// missing release).
	_, err = artifacts.OfferVersion(ctx, st.Pool, "otelcol", "v1.0.0", []string{pkg}, "test")
	if !errors.Is(err, artifacts.ErrNotOfferable) || strings.Contains(err.Error(), "AcceptsPackages") || !strings.Contains(err.Error(), "no asset") {
		t.Fatalf("offer to an agent with AcceptsPackages: %v", err)
	}
	var n int
	if err := st.Pool.QueryRow(ctx, `SELECT count(*) FROM agent_package_offers`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("offers recorded: %d %v", n, err)
	}
}
