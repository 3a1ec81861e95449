package ui_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/config"
	"github.com/myriarch/myriarch/internal/fleet/daemon"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/fleet/ui"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// The software page shows the sources with their errors, the releases,
// and a running download's progress (and reloads itself while it runs).
func TestSoftwarePageShowsSourcesReleasesAndProgress(t *testing.T) {
	pg := pgtest.New(t)
	cfg, err := config.Load(config.Source{Environ: []string{}, Overrides: map[string]string{
		"database.url": pg.DSN(""), "server.enrollmentSecret": "0123456789abcdef-secret", "ha.replicaId": "replica-ui",
		"server.opampListen": "127.0.0.1:0", "server.httpListen": "127.0.0.1:0", "ha.leaderSessionTimeout": "10s",
		"jobs.releaseTrackerInterval": "1h", "jobs.artifactPrefetchInterval": "24h",
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	d, err := daemon.Start(sctx, daemon.Options{Config: cfg, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Mount: ui.Mount, Version: "ui-test"})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer d.Shutdown()
	// The UI's cookie is an opaque session of a token, not the token.
	tk, _, err := d.Store.IssueTokenRole(ctx, "ui", store.RoleViewer)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := d.Store.CreateSession(ctx, tk.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
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
	get := func(path string) string {
		req, _ := http.NewRequest(http.MethodGet, "http://"+d.HTTPAddr().String()+path, nil)
		req.AddCookie(&http.Cookie{Name: ui.CookieName, Value: tok})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		return string(b)
	}
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
