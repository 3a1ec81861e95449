package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/health"
	"github.com/myriarch/myriarch/internal/bridge/opamp"
	"github.com/myriarch/myriarch/internal/bridge/runtime"
	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/version"
	"github.com/myriarch/myriarch/lease"
)

// Exit statuses of run besides 0 and cli.ExitUsage.
const (
	exitFailed = 1
	// exitStepDown: a broker-path step-down, terminal for the process; the
	// orchestrator restarts it and it rejoins as a standby.
	exitStepDown = 3
)

func init() {
	commands.Register(cli.Command{
		Name:    "run",
		Summary: "run the bridge (the default command)",
		Run:     runBridge,
	})
}

func runBridge(args []string, _, stderr io.Writer) int {
	fs, file := fileFlags("myriarch-bridge run", stderr)
	logFormat := fs.String("log-format", "text", "text or json")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if code, ok := parseFileFlags(fs, file, args, "usage: myriarch-bridge run -c FILE [-log-format text|json] [-log-level info]", stderr); !ok {
		return code
	}
	logger, ok := newLogger(*logFormat, *logLevel, stderr)
	if !ok {
		return cli.ExitUsage
	}
	slog.SetDefault(logger)
	cfg, err := config.Load(*file)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return cli.ExitUsage
	}
	for _, w := range cfg.Warnings {
		logger.Warn(w)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runLoaded(ctx, cfg, *file, logger)
}

// newLogger is the logger of -log-format and -log-level; a bad value is
// reported and not ok.
func newLogger(format, levelName string, stderr io.Writer) (*slog.Logger, bool) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(levelName)); err != nil {
		fmt.Fprintf(stderr, "-log-level: %q: %v\n", levelName, err)
		return nil, false
	}
	hopts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(stderr, hopts)), true
	case "json":
		return slog.New(slog.NewJSONHandler(stderr, hopts)), true
	}
	fmt.Fprintf(stderr, "-log-format: %q: must be text or json\n", format)
	return nil, false
}

// runLoaded runs the bridge of a loaded configuration until ctx ends or
// it fails, with its HTTP listener, SIGHUP reload and OpAMP client.
func runLoaded(ctx context.Context, cfg *config.Config, file string, logger *slog.Logger) int {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(version.Collector("myriarch-bridge", version.String()))
	b, err := runtime.New(ctx, cfg, runtime.Options{Logger: logger, Registerer: reg})
	if err != nil {
		logger.Error("starting the bridge", "err", err)
		return exitFailed
	}
	b.LogBudgets()
	if cfg.Bridge.HTTPListen != "off" {
		srv, err := health.Listen(cfg.Bridge.HTTPListen, health.Handler(b, reg))
		if err != nil {
			logger.Error("http listener", "addr", cfg.Bridge.HTTPListen, "err", err)
			return exitFailed
		}
		logger.Info("serving /live /ready /status /metrics", "addr", srv.Addr())
		defer shutdownWithin(5*time.Second, srv.Shutdown)
	}
	logger.Info("bridge started", "instance", b.InstanceID(), "deployment_mode", cfg.Bridge.DeploymentMode, "sessions", len(cfg.Sessions), "routes", len(cfg.Routes))
	stopHUP := reloadOnHUP(ctx, b, file, logger)
	defer stopHUP()
	if cfg.OpAMP != nil {
		oc, err := opamp.Start(ctx, opamp.Options{Settings: cfg.OpAMP, File: file, StateDir: cfg.Bridge.StateDir,
			BridgeID: cfg.Bridge.ID, InstanceID: b.InstanceID(), Version: version.String(), Bridge: b, Logger: logger, Gatherer: reg})
		if err != nil {
			logger.Error("starting the OpAMP client", "err", err)
			return exitFailed
		}
		defer shutdownWithin(10*time.Second, oc.Stop)
	}
	return exitStatus(b.Run(ctx), logger)
}

// shutdownWithin calls stop with a context that ends after d.
func shutdownWithin(d time.Duration, stop func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_ = stop(ctx)
}

// exitStatus logs how the bridge ended and returns the process status.
func exitStatus(err error, logger *slog.Logger) int {
	switch {
	case errors.Is(err, lease.ErrDependencyStepDown):
		logger.Error("exiting after a broker-path step-down; restart this process and it rejoins as a standby", "err", err)
		return exitStepDown
	case err != nil:
		logger.Error("bridge failed", "err", err)
		return exitFailed
	}
	logger.Info("bridge stopped")
	return 0
}

// reloadOnHUP applies the configuration file again on every SIGHUP, like a
// remote configuration: checked like `check`, refused whole with every
// problem logged, or applied by reload. The returned func stops it.
func reloadOnHUP(ctx context.Context, b *runtime.Bridge, file string, logger *slog.Logger) func() {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-quit:
				return
			case <-hup:
				data, err := os.ReadFile(file)
				if err == nil {
					var d config.Diff
					d, err = b.ApplyFile(ctx, file, data, false)
					if err == nil {
						logger.Info("SIGHUP: configuration reloaded", "file", file, "kept", d.Kept, "changed", d.Changed, "added", d.Added, "removed", d.Removed)
						continue
					}
				}
				logger.Error("SIGHUP: configuration refused; nothing changed", "file", file, "err", err)
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		close(quit)
		<-done
	}
}
