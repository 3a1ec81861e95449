package ui_test

import (
	"context"
	"strings"
	"testing"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// The software page shows the sources with their errors, the releases,
// and a running download's progress (and reloads itself while it runs).
func TestSoftwarePageShowsSourcesReleasesAndProgress(t *testing.T) {
	d := startUI(t, "replica-ui", map[string]string{"jobs.releaseTrackerInterval": "1h", "jobs.artifactPrefetchInterval": "24h"})
	ctx := context.Background()
	// The UI's cookie is an opaque session of a token, not the token.
	tok := sessionOf(t, d, store.RoleViewer)
	for _, q := range []string{
		`INSERT INTO package_sources (name, type, source, poll_interval_ms, last_polled_at, last_error) VALUES ('otelcol', 'oci', 'registry.example/agents/otelcol', 60000, now(), 'registry unreachable')`,
		`INSERT INTO package_releases (package, version, published_at, term) VALUES ('otelcol', 'v1.4.0', now(), 1)`,
		`INSERT INTO package_assets (package, version, name, os, arch, digest, size, url) VALUES ('otelcol', 'v1.4.0', 'otelcol_linux_amd64.tgz', 'linux', 'amd64', 'sha256:ab', 1000, 'x@sha256:ab')`,
		`INSERT INTO package_rollouts (package, version, spec, state, wave, waves, reason) VALUES ('otelcol', 'v1.4.0', '{}', 'paused', 1, 3, '2 agents failed')`,
		`INSERT INTO artifact_downloads (digest, package, version, asset, state, bytes, total, attempts, replica_id, term) VALUES ('sha256:ab', 'otelcol', 'v1.4.0', 'otelcol_linux_amd64.tgz', 'downloading', 500, 1000, 1, 'replica-ui', 1)`,
	} {
		if _, err := d.Store.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	get := func(path string) string { return getPage(t, d, tok, path) }
	page := get("/ui/software")
	for _, want := range []string{"registry.example/agents/otelcol", "registry unreachable", "v1.4.0", "otelcol_linux_amd64.tgz (linux/amd64)",
		`<progress max="100" value="50"></progress> 50 %`, "500 / 1000 bytes", `http-equiv="refresh"`, `id="nav-software"`, "2 agents failed", "1 / 3"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(get("/ui/software?refresh=0"), `http-equiv="refresh"`) {
		t.Error("refresh=0 still reloads")
	}
}
