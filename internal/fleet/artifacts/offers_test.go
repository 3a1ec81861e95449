package artifacts_test

import (
	"context"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"

	"github.com/myriarch/myriarch/internal/fleet/artifacts"
	"github.com/myriarch/myriarch/internal/fleet/opampserver"
	"github.com/myriarch/myriarch/internal/fleet/releases"
	"github.com/myriarch/myriarch/internal/fleet/store"
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

// What the OpAMP server asks before it sends an offer to a plain-HTTP
// agent again: whether the agent's stored package statuses acknowledge the
// offered hash, and whether the last send is old enough (decided by the
// database, so two replicas do not both re-send).
func TestOfferAcknowledgementAndResendCondition(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	const uid = "0190a1b2-0000-4000-8000-0000000000d1"
	offered, src := offerToAgent(t, st, uid, []byte("otelcol build"))
	pending := func() opampserver.PendingPackages {
		t.Helper()
		p, err := src.Pending(ctx, []string{uid})
		if err != nil {
			t.Fatal(err)
		}
		return p[uid]
	}
	if p := pending(); p.Acked || p.SentConn != "" {
		t.Fatalf("a new offer: %+v", p)
	}
	// Not sent over plain HTTP yet: nothing to send again.
	if again, err := src.Resend(ctx, uid, opampserver.HTTPConnID, 0); err != nil || again {
		t.Fatalf("resend of an unsent offer: %v %v", again, err)
	}
	if err := src.Sent(ctx, uid, opampserver.HTTPConnID); err != nil {
		t.Fatal(err)
	}
	if again, err := src.Resend(ctx, uid, opampserver.HTTPConnID, time.Hour); err != nil || again {
		t.Fatalf("resend within the interval: %v %v", again, err)
	}
	if again, err := src.Resend(ctx, uid, opampserver.HTTPConnID, 0); err != nil || !again {
		t.Fatalf("resend after the interval: %v %v", again, err)
	}

	hash := hex.EncodeToString(offered[0].PackageHash())
	all := hex.EncodeToString(pending().Msg.GetAllPackagesHash())
	for _, c := range []struct {
		status string
		acked  bool
	}{
		{`{"packages": {"otelcol": {"server_offered_hash": "` + hash + `", "status": "PackageStatusEnum_Installing"}}}`, true},
		{`{"packages": {"otelcol": {"agent_has_hash": "` + hash + `", "status": "PackageStatusEnum_Installed"}}}`, true},
		{`{"packages": {"otelcol": {"server_offered_hash": "00", "agent_has_hash": "11"}}}`, false},
		{`{"packages": {"other": {"server_offered_hash": "` + hash + `"}}}`, false},
		// opamp-go names the offer's AllPackagesHash before it reaches
		// each package of it.
		{`{"packages": {}, "server_provided_all_packages_hash": "` + all + `"}`, true},
		{`{"packages": {}, "server_provided_all_packages_hash": "00"}`, false},
	} {
		if _, err := st.Pool.Exec(ctx, `UPDATE agents SET package_statuses = $2 WHERE instance_uid = $1`, uid, c.status); err != nil {
			t.Fatal(err)
		}
		if p := pending(); p.Acked != c.acked {
			t.Fatalf("statuses %s: acked %v, want %v", c.status, p.Acked, c.acked)
		}
	}
}

// The same version offered again after the agent reported it failed to
// install it: the stored status names the offered hash, but for the
// earlier offer; the new one, not sent yet, is not acknowledged (a
// plain-HTTP agent would never get it), and is once it went out.
func TestReofferOfTheSameHashIsNotAcknowledgedUntilSent(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	const uid = "0190a1b2-0000-4000-8000-0000000000d2"
	offered, src := offerToAgent(t, st, uid, []byte("otelcol build 2"))
	if err := src.Sent(ctx, uid, opampserver.HTTPConnID); err != nil {
		t.Fatal(err)
	}
	hash := hex.EncodeToString(offered[0].PackageHash())
	if _, err := st.Pool.Exec(ctx, `UPDATE agents SET package_statuses = $2 WHERE instance_uid = $1`, uid,
		`{"packages": {"otelcol": {"server_offered_hash": "`+hash+`", "agent_has_hash": "", "status": "PackageStatusEnum_InstallFailed", "error": "disk full"}}}`); err != nil {
		t.Fatal(err)
	}
	if _, err := artifacts.OfferVersion(ctx, st.Pool, "otelcol", "v1.0.0", []string{uid}, "retry"); err != nil {
		t.Fatal(err)
	}
	p, err := src.Pending(ctx, []string{uid})
	if err != nil {
		t.Fatal(err)
	}
	if p[uid].SentConn != "" || p[uid].Acked {
		t.Fatalf("the offer made again: sent on %q, acknowledged %v; want neither", p[uid].SentConn, p[uid].Acked)
	}
	if err := src.Sent(ctx, uid, opampserver.HTTPConnID); err != nil {
		t.Fatal(err)
	}
	if p, err = src.Pending(ctx, []string{uid}); err != nil || !p[uid].Acked {
		t.Fatalf("sent, with a status naming its hash: %+v (%v), want acknowledged", p[uid], err)
	}
}

// offerToAgent registers an agent uid that accepts packages and reports
// their statuses, a release of otelcol v1.0.0 whose blob (data) is stored,
// and offers that version to the agent; it returns the offer and an
// OfferSource on the store.
func offerToAgent(t *testing.T, st *store.Store, uid string, data []byte) ([]artifacts.Offer, artifacts.OfferSource) {
	t.Helper()
	ctx := context.Background()
	caps := int64(protobufs.AgentCapabilities_AgentCapabilities_AcceptsPackages | protobufs.AgentCapabilities_AgentCapabilities_ReportsPackageStatuses)
	if _, err := st.Pool.Exec(ctx, `INSERT INTO agents (instance_uid, attrs, capabilities) VALUES ($1, '{"os.type":"linux","host.arch":"amd64"}', $2)`, uid, caps); err != nil {
		t.Fatal(err)
	}
	release(t, st.Pool, "otelcol", "v1.0.0", releases.Asset{Name: "otelcol.tgz", Digest: digestOf(data), Size: int64(len(data)), URL: "http://127.0.0.1:9/x"})
	if _, err := st.Pool.Exec(ctx, `INSERT INTO artifact_blobs (digest, size, term) VALUES ($1, $2, 1)`, digestOf(data), len(data)); err != nil {
		t.Fatal(err)
	}
	offered, err := artifacts.OfferVersion(ctx, st.Pool, "otelcol", "v1.0.0", []string{uid}, "test")
	if err != nil {
		t.Fatal(err)
	}
	return offered, artifacts.OfferSource{Pool: st.Pool, BaseURL: func() string { return "http://replica" }}
}
