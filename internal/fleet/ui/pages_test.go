package ui_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/config"
	"github.com/myriarch/myriarch/internal/fleet/daemon"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/fleet/ui"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// startUI starts one replica with the UI mounted on a fresh database, with
// settings overriding the test defaults; it stops with the test.
func startUI(t *testing.T, replica string, settings map[string]string) *daemon.Daemon {
	t.Helper()
	pg := pgtest.New(t)
	ov := map[string]string{
		"database.url": pg.DSN(""), "server.enrollmentSecret": "0123456789abcdef-secret", "ha.replicaId": replica,
		"server.opampListen": "127.0.0.1:0", "server.httpListen": "127.0.0.1:0", "ha.leaderSessionTimeout": "10s",
	}
	for k, v := range settings {
		ov[k] = v
	}
	cfg, err := config.Load(config.Source{Environ: []string{}, Overrides: ov})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := daemon.Start(ctx, daemon.Options{Config: cfg, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Mount: ui.Mount, Version: "ui-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Shutdown() })
	return d
}

// sessionOf returns a UI session (the cookie's opaque id) of a new token
// with role.
func sessionOf(t *testing.T, d *daemon.Daemon, role store.Role) string {
	t.Helper()
	ctx := context.Background()
	tk, _, err := d.Store.IssueTokenRole(ctx, "t-"+string(role), role)
	if err != nil {
		t.Fatal(err)
	}
	sess, err := d.Store.CreateSession(ctx, tk.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return sess
}

// getPage fetches path with session as the UI cookie; anything but 200
// fails the test.
func getPage(t *testing.T, d *daemon.Daemon, session, path string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+d.HTTPAddr().String()+path, nil)
	req.AddCookie(&http.Cookie{Name: ui.CookieName, Value: session})
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

// Every page sends its own time as the trailer Server-Timing (what the
// telemetry benchmark reports), after the body.
func TestPagesSendServerTiming(t *testing.T) {
	d := startUI(t, "replica-timing", nil)
	sess := sessionOf(t, d, store.RoleViewer)
	for _, path := range []string{"/ui/", "/ui/agents", "/ui/cluster"} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+d.HTTPAddr().String()+path, nil)
		req.AddCookie(&http.Cookie{Name: ui.CookieName, Value: sess})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		v := resp.Trailer.Get("Server-Timing")
		ms, ok := strings.CutPrefix(v, "app;dur=")
		if f, err := strconv.ParseFloat(ms, 64); resp.StatusCode != 200 || !ok || err != nil || f <= 0 {
			t.Errorf("GET %s: %d, Server-Timing %q", path, resp.StatusCode, v)
		}
	}
}
