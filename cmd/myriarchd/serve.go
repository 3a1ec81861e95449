package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/devdb"
	"github.com/myriarch/myriarch/internal/fleet/config"
	"github.com/myriarch/myriarch/internal/fleet/daemon"
	"github.com/myriarch/myriarch/internal/fleet/ui"
)

// version is set with -ldflags "-X main.version=...".
var version = "dev"

func init() {
	commands.Register(cli.Command{
		Name:    "serve",
		Summary: "run a replica of the fleet control plane (default command; --dev for a private PostgreSQL)",
		Run:     runServe,
	})
}

func runServe(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("serve", "", stderr)
	cfgFile := fs.String("config", os.Getenv("MYRIARCH_CONFIG"), "YAML configuration file (env MYRIARCH_CONFIG)")
	dev := fs.Bool("dev", false, "start a private PostgreSQL from the local installation (initdb/pg_ctl) and print the UI address and an admin token")
	devDir := fs.String("dev-dir", devdb.DefaultDir(), "private (0700) data directory of --dev, kept between runs")
	if err := fs.Parse(args); err != nil {
		return cli.ExitUsage
	}
	src := config.Source{File: *cfgFile}
	if *dev {
		src.Optional = []string{"database.url", "server.enrollmentSecret"}
	}
	cfg, code := loadConfig(src, stderr)
	if cfg == nil {
		return code
	}
	log := newLogger(cfg, stderr)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if !*dev {
		return serve(ctx, stop, cfg, log, stderr, nil)
	}
	pg, err := startDevPostgres(ctx, cfg, *devDir, log)
	if err != nil {
		fmt.Fprintln(stderr, "myriarchd --dev:", err)
		return 1
	}
	defer stopDevPostgres(pg, log)
	return serve(ctx, stop, cfg, log, stderr, func(d *daemon.Daemon) { printDevBanner(stdout, stderr, d, cfg, pg, *devDir) })
}

// serve starts the replica, calls started (if any), and runs until ctx
// ends; then it stops the signal handler (a second signal kills the
// process) and shuts the replica down.
func serve(ctx context.Context, stop func(), cfg *config.Config, log *slog.Logger, stderr io.Writer, started func(*daemon.Daemon)) int {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	d, err := daemon.Start(sctx, daemon.Options{Config: cfg, Log: log, Version: version, Mount: ui.Mount})
	cancel()
	if err != nil {
		fmt.Fprintln(stderr, "myriarchd:", err)
		return 1
	}
	if started != nil {
		started(d)
	}
	<-ctx.Done()
	stop() // a second signal kills the process
	log.Info("stopping (planned stop)")
	if err := d.Shutdown(); err != nil {
		log.Error("planned stop finished with errors", "error", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

// printDevBanner tells the operator of --dev where everything is.
func printDevBanner(stdout, stderr io.Writer, d *daemon.Daemon, cfg *config.Config, pg *devdb.DB, devDir string) {
	tok, err := d.Store.CreateToken(context.Background(), "dev-admin")
	if err != nil {
		fmt.Fprintln(stderr, "myriarchd --dev: creating the admin token:", err)
	}
	fmt.Fprintf(stdout, "myriarchd (dev) is running\n  UI:           http://%s/ui/\n  admin token:  %s\n  OpAMP:        ws://%s%s (Authorization: Bearer %s)\n  PostgreSQL:   %s\n  data dir:     %s\nPress Ctrl-C to stop.\n",
		displayAddr(d.HTTPAddr()), tok, displayAddr(d.OpAMPAddr()), cfg.Server.OpAMPPath, cfg.Server.EnrollmentSecret, pg.DSN(""), devDir)
}

func stopDevPostgres(pg *devdb.DB, log *slog.Logger) {
	sctx, cancel := context.WithTimeout(context.Background(), devdb.StopTimeout)
	defer cancel()
	if err := pg.Stop(sctx); err != nil {
		log.Error("stopping the dev PostgreSQL failed", "error", err)
	}
}

func newLogger(cfg *config.Config, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(cfg.Log.Level))
	opts := &slog.HandlerOptions{Level: lvl}
	if cfg.Log.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func displayAddr(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "localhost"
	}
	return net.JoinHostPort(host, port)
}

// startDevPostgres starts (creating on first use) the private database of
// --dev in dir and points the configuration at it.
func startDevPostgres(ctx context.Context, cfg *config.Config, dir string, log *slog.Logger) (*devdb.DB, error) {
	pg, err := devdb.Start(ctx, dir, func(f string, a ...any) { log.Info(fmt.Sprintf(f, a...)) })
	if err != nil {
		return nil, fmt.Errorf("--dev-dir %s: %w", dir, err)
	}
	if cfg.Database.URL == "" {
		cfg.Database.URL = pg.DSN("")
	}
	if cfg.Server.EnrollmentSecret == "" {
		secretFile := filepath.Join(dir, "enrollment-secret")
		b, err := os.ReadFile(secretFile)
		if errors.Is(err, os.ErrNotExist) {
			var r [24]byte
			_, _ = rand.Read(r[:])
			b = []byte(base64.RawURLEncoding.EncodeToString(r[:]))
			err = os.WriteFile(secretFile, b, 0o600)
		}
		if err != nil {
			return nil, err
		}
		cfg.Server.EnrollmentSecret = strings.TrimSpace(string(b))
	}
	return pg, nil
}
