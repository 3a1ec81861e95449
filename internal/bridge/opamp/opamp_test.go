package opamp

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/open-telemetry/opamp-go/protobufs"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/runtime"
)

func TestInstanceUIDSurvivesRestarts(t *testing.T) {
	p := filepath.Join(t.TempDir(), "state", "b-opamp-instance-uid")
	a, err := LoadOrCreateUID(p)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadOrCreateUID(p)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatalf("uid changed across loads: %s, %s", UIDString(a), UIDString(b))
	}
	if a[6]>>4 != 4 {
		t.Fatalf("not a version 4 uid: %s", UIDString(a))
	}
	if err := os.WriteFile(p, []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateUID(p); err == nil || !strings.Contains(err.Error(), `"garbage": must hold an instance uid of 32 hex digits`) {
		t.Fatalf("a damaged uid file must be refused, not replaced: %v", err)
	}
}

func TestSessionStatusText(t *testing.T) {
	tf, ff := 0.25, 1.5
	s := runtime.SessionStatus{ID: "plant", Mode: "exclusive", Role: "owner", ServiceLevel: "full", LeaseVersion: 7,
		LeaseOwner: "a#1f", InFlight: 3, TakeoverToFull: &tf, FailureToFull: &ff}
	got := SessionStatusText(s)
	want := "mode=exclusive role=owner service_level=full lease_version=7 lease_owner=a#1f in_flight=3 last_takeover_to_full_s=0.250 last_failure_to_full_s=1.500"
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if m := ParseStatusText(got); m["lease_version"] != "7" || m["role"] != "owner" || len(m) != 8 {
		t.Fatalf("parsed %v", m)
	}
}

// An offered credential is kept in state_dir, 0600, and read at the next
// start.
func TestOfferedCredentialIsKept(t *testing.T) {
	dir := t.TempDir()
	c := &Client{o: Options{StateDir: dir, BridgeID: "b"}, log: slog.Default()}
	offer := &protobufs.OpAMPConnectionSettings{Headers: &protobufs.Headers{Headers: []*protobufs.Header{{Key: "Authorization", Value: "Bearer myr_agent_123"}}}}
	if err := c.onConnectionSettings(context.Background(), offer); err != nil {
		t.Fatal(err)
	}
	if c.credential != "myr_agent_123" {
		t.Fatalf("credential %q", c.credential)
	}
	fi, err := os.Stat(filepath.Join(dir, "b-opamp-credential"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("credential file: %v %v", fi, err)
	}
	bad := &protobufs.OpAMPConnectionSettings{Headers: &protobufs.Headers{Headers: []*protobufs.Header{{Key: "Authorization", Value: "Basic x"}}}}
	if err := c.onConnectionSettings(context.Background(), bad); err == nil || c.credential != "myr_agent_123" {
		t.Fatalf("a non-bearer offer must be refused and change nothing: %v %q", err, c.credential)
	}
}

// The own_metrics offer's headers carry the agent's credential: when
// OpAMP runs over TLS, a plain http:// destination (myriarchd's
// telemetry.publicUrl written with http://) is refused rather than sent
// the credential in clear text; an https:// one is taken.
func TestOwnMetricsRefusesPlainHTTPUnderTLS(t *testing.T) {
	offer := func(dest string) *protobufs.ConnectionSettingsOffers {
		return &protobufs.ConnectionSettingsOffers{OwnMetrics: &protobufs.TelemetryConnectionSettings{DestinationEndpoint: dest,
			Headers: &protobufs.Headers{Headers: []*protobufs.Header{{Key: "Authorization", Value: "Bearer myr_agent_123"}}}}}
	}
	for _, tc := range []struct {
		server, dest string
		ok           bool
	}{
		{"wss://myriarchd.example:4320/v1/opamp", "http://myriarchd.example:4320/v1/metrics", false},
		{"https://myriarchd.example:4320/v1/opamp", "http://myriarchd.example:4320/v1/metrics", false},
		{"wss://myriarchd.example:4320/v1/opamp", "https://myriarchd.example:4320/v1/metrics", true},
		{"ws://127.0.0.1:4320/v1/opamp", "http://127.0.0.1:4320/v1/metrics", true},
	} {
		c := &Client{o: Options{Settings: &config.OpAMPSettings{ServerURL: tc.server}}, log: slog.Default()}
		m := &ownMetrics{c: c}
		err := m.onConnectionSettings(context.Background(), offer(tc.dest))
		if (err == nil) != tc.ok {
			t.Errorf("server %s, destination %s: err %v, want ok %v", tc.server, tc.dest, err, tc.ok)
		}
		if got := m.dest; (got != "") != tc.ok {
			t.Errorf("server %s, destination %s: kept %q", tc.server, tc.dest, got)
		}
	}
}
