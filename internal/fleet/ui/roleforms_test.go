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
	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/daemon"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/fleet/ui"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// A configuration page shows the rollout form only to sessions whose role
// may start one (the route refuses it anyway; the page should not offer
// what the viewer cannot do).
func TestConfigPageOffersRolloutsByRole(t *testing.T) {
	pg := pgtest.New(t)
	cfg, err := config.Load(config.Source{Environ: []string{}, Overrides: map[string]string{
		"database.url": pg.DSN(""), "server.enrollmentSecret": "0123456789abcdef-secret", "ha.replicaId": "replica-roles",
		"server.opampListen": "127.0.0.1:0", "server.httpListen": "127.0.0.1:0", "ha.leaderSessionTimeout": "10s",
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
	if _, err := (configs.Service{Store: d.Store}).Put(ctx, store.ConfigDef{Name: "edge", Type: configs.TypeYAML, Selector: map[string]string{"role": "edge"}}); err != nil {
		t.Fatal(err)
	}
	page := func(role store.Role) string {
		tk, _, err := d.Store.IssueTokenRole(ctx, "t-"+string(role), role)
		if err != nil {
			t.Fatal(err)
		}
		sess, err := d.Store.CreateSession(ctx, tk.ID, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodGet, "http://"+d.HTTPAddr().String()+"/ui/configs/edge", nil)
		req.AddCookie(&http.Cookie{Name: ui.CookieName, Value: sess})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: GET /ui/configs/edge: %d %s", role, resp.StatusCode, b)
		}
		return string(b)
	}
	if p := page(store.RoleViewer); strings.Contains(p, `id="rollout-form"`) {
		t.Error("a viewer is offered the rollout form")
	}
	if p := page(store.RoleOperator); !strings.Contains(p, `id="rollout-form"`) {
		t.Error("an operator is not offered the rollout form")
	}
}
