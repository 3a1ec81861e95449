// Package otelagent runs a real OpAMP agent for tests: the OpenTelemetry
// OpAMP supervisor (v0.149.0) managing a small OpenTelemetry Collector
// (OTLP and nop receivers, debug and nop exporters, OpAMP extension), both
// built by `make otel-agent` (tools/otelagent/build.sh) into a cache
// directory outside the clone.
//
// Start(t, serverURL, Options{...}) starts a supervisor against a
// myriarchd OpAMP endpoint and stops it when the test ends. Without the
// binaries a test is skipped, except under CI=true, where it fails: CI
// builds them first.
//
// Two things the supervisor does at start that a test helper must allow
// for (both made starts fail before; see TestSupervisorsStartTogether):
//
//   - It probes the collector's feature gates (`otelcol featuregate`) and
//     reads its output. When that output is lost (it sometimes is), the
//     supervisor does not know that the collector accepts a config without
//     pipelines and starts its bootstrap collector with a nop pipeline
//     (nop receiver, nop exporter). A collector without those components
//     refuses that config, and the supervisor gives up after its
//     bootstrap_timeout. The collector is therefore built with them.
//   - Every collector serves its own metrics on localhost:8888 by default,
//     so a second collector on the host (another supervisor of the same
//     test, or of a test in another package running at the same time)
//     cannot start. Each collector this package starts has its own
//     metrics turned off (agent.args adds a --config that sets
//     service.telemetry.metrics.level to none; the supervisor passes
//     agent.args to its bootstrap collector, its collector and the
//     validate command).
package otelagent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/template"
	"time"
)

// Version is the OpenTelemetry release that tools/otelagent builds.
const Version = "0.149.0"

// Binary names in BinDir.
const (
	SupervisorBinary = "opampsupervisor"
	CollectorBinary  = "otelcol-myriarch"
)

// BinDir is where tools/otelagent/build.sh puts the binaries:
// $OTEL_AGENT_DIR/bin, by default ~/.cache/myriarch/otel-v<Version>/bin.
func BinDir() string {
	if d := os.Getenv("OTEL_AGENT_DIR"); d != "" {
		return filepath.Join(d, "bin")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "myriarch", "otel-v"+Version, "bin")
}

// Binaries returns the paths of the supervisor and the collector. When
// one is missing it skips the test, or fails it under CI=true. A cached
// collector built before it had the nop components (package doc) fails
// the test with the command that rebuilds it.
func Binaries(t testing.TB) (supervisor, collector string) {
	t.Helper()
	supervisor, collector = filepath.Join(BinDir(), SupervisorBinary), filepath.Join(BinDir(), CollectorBinary)
	for _, p := range []string{supervisor, collector} {
		if _, err := os.Stat(p); err != nil {
			msg := fmt.Sprintf("%s missing: build the real OpAMP agent with `make otel-agent` (about 10 minutes the first time; cached in %s)", p, BinDir())
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	if err := checkComponents(collector); err != nil {
		t.Fatalf("%v: rebuild it with `make otel-agent`", err)
	}
	return supervisor, collector
}

// RequiredComponents are the modules the collector must be built with:
// the tests' pipelines and the supervisor's nop bootstrap pipeline.
var RequiredComponents = []string{
	"go.opentelemetry.io/collector/receiver/otlpreceiver",
	"go.opentelemetry.io/collector/receiver/nopreceiver",
	"go.opentelemetry.io/collector/exporter/debugexporter",
	"go.opentelemetry.io/collector/exporter/nopexporter",
	"github.com/open-telemetry/opentelemetry-collector-contrib/extension/opampextension",
}

var components sync.Map // collector path → error of checkComponents

// checkComponents runs `collector components` once per path and reports
// the required modules it lacks.
func checkComponents(collector string) error {
	if v, ok := components.Load(collector); ok {
		err, _ := v.(error)
		return err
	}
	out, err := exec.Command(collector, "components").CombinedOutput()
	if err != nil {
		err = fmt.Errorf("%s components: %v: %s", collector, err, out)
	} else {
		var missing []string
		for _, m := range RequiredComponents {
			if !bytes.Contains(out, []byte(m+" ")) {
				missing = append(missing, m)
			}
		}
		if len(missing) > 0 {
			err = fmt.Errorf("%s lacks %s", collector, strings.Join(missing, ", "))
		}
	}
	components.Store(collector, err)
	return err
}

// Options configure a supervisor.
type Options struct {
	// Secret is myriarchd's enrollment secret, sent as a bearer token.
	Secret string
	// ValidateConfig has the supervisor validate a remote config with the
	// collector before applying it (agent.validate_config): a bad one is
	// then reported FAILED with the collector's error text and never run.
	// The supervisor v0.149.0 validates the new config merged with the
	// running one (which wins), so an error in a pipeline that the running
	// config also has goes unnoticed (see PipelineConfig).
	// Off, a bad config is applied, the collector crashes and the
	// supervisor reports FAILED.
	ValidateConfig bool
	// Heartbeat declares ReportsHeartbeat (opamp-go's default interval, 30 s).
	Heartbeat bool
	// StartTimeout bounds the start (until the supervisor reports that it
	// connected); default 90s (a loaded machine).
	StartTimeout time.Duration
	// OwnMetrics declares reports_own_metrics (and accepts OpAMP
	// connection settings, to hold the credential that the own-metrics
	// destination is offered with). The collector's own metrics are then
	// on: pulled on a free port of 127.0.0.1 until myriarchd offers a
	// destination, then pushed there every OwnMetricsInterval (the SDK's
	// OTEL_METRIC_EXPORT_INTERVAL; default 2s). Only the bootstrap
	// collector (a few seconds at start) binds localhost:8888: it takes
	// agent.args and no config file, so do not start two such supervisors
	// at once.
	OwnMetrics         bool
	OwnMetricsInterval time.Duration
}

// Supervisor is a running OpAMP supervisor and its collector.
type Supervisor struct {
	t       testing.TB
	dir     string
	cfgPath string
	bin     string
	o       Options

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	log  *syncBuffer
}

const configTmpl = `server:
  endpoint: {{.Endpoint}}
  headers:
    Authorization: ["Bearer {{.Secret}}"]
capabilities:
  reports_effective_config: true
  reports_own_metrics: {{.OwnMetrics}}
{{- if .OwnMetrics}}
  accepts_opamp_connection_settings: true
{{- end}}
  reports_own_logs: false
  reports_own_traces: false
  reports_health: true
  accepts_remote_config: true
  reports_remote_config: true
  accepts_restart_command: true
{{- if .Heartbeat}}
  reports_heartbeat: true
{{- end}}
storage:
  directory: {{.Storage}}
agent:
  executable: {{.Collector}}
  validate_config: {{.Validate}}
  config_apply_timeout: 10s
  bootstrap_timeout: 30s
{{- if .OwnMetrics}}
  config_files: ["{{.Base}}", "$OWN_TELEMETRY_CONFIG", "$OPAMP_EXTENSION_CONFIG", "$REMOTE_CONFIG"]
  env:
    OTEL_METRIC_EXPORT_INTERVAL: "{{.IntervalMS}}"
{{- else}}
  args: ["--config", "{{.TelemetryOff}}"]
{{- end}}
telemetry:
  logs:
    level: info
`

// Start starts a supervisor against serverURL (ws://host:port/v1/opamp or
// http://...) and registers its Stop with t.Cleanup. It fails the test
// when the supervisor does not connect after two retries.
func Start(t testing.TB, serverURL string, o Options) *Supervisor {
	t.Helper()
	sup, col := Binaries(t)
	if o.StartTimeout <= 0 {
		o.StartTimeout = 90 * time.Second
	}
	dir := t.TempDir()
	s := &Supervisor{t: t, dir: dir, bin: sup, o: o, cfgPath: filepath.Join(dir, "supervisor.yaml")}
	base := filepath.Join(dir, "own-metrics-base.yaml")
	if o.OwnMetrics {
		if o.OwnMetricsInterval <= 0 {
			o.OwnMetricsInterval = 2 * time.Second
		}
		if err := os.WriteFile(base, fmt.Appendf(nil, ownMetricsBase, FreePort(t)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var b bytes.Buffer
	err := template.Must(template.New("cfg").Parse(configTmpl)).Execute(&b, map[string]any{
		"Endpoint": serverURL, "Secret": o.Secret, "Storage": filepath.Join(dir, "storage"), "Collector": col,
		"Validate": o.ValidateConfig, "Heartbeat": o.Heartbeat, "TelemetryOff": TelemetryOff,
		"OwnMetrics": o.OwnMetrics, "Base": base, "IntervalMS": o.OwnMetricsInterval.Milliseconds()})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.cfgPath, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stopping the supervisor: %v", err)
		}
		if t.Failed() {
			t.Logf("supervisor log:\n%s\ncollector log:\n%s", s.Log(), s.CollectorLog())
		}
	})
	// No retry: the two causes of failed starts are fixed (package doc),
	// and a retry would hide a new one.
	if err := s.start(); err != nil {
		t.Fatalf("OpAMP supervisor did not start: %v\nlog:\n%s\ncollector log:\n%s", err, s.Log(), s.CollectorLog())
	}
	return s
}

// TelemetryOff is the collector config (a yaml: URI, merged after the
// supervisor's own) that turns the collector's own metrics off, so that
// it does not bind localhost:8888.
const TelemetryOff = "yaml:service::telemetry::metrics::level: none"

// ownMetricsBase is the first config file of an OwnMetrics collector: its
// own metrics on, pulled on a free port (%d) until the supervisor's own
// telemetry section (merged after it) replaces the readers with the
// offered destination.
const ownMetricsBase = `service:
  telemetry:
    metrics:
      level: normal
      readers:
        - pull:
            exporter:
              prometheus:
                host: 127.0.0.1
                port: %d
`

func (s *Supervisor) start() error {
	s.mu.Lock()
	s.log = &syncBuffer{}
	cmd := exec.Command(s.bin, "--config", s.cfgPath)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = s.log, s.log
	// Its own process group, so that Stop reaches the collector too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	deadline := time.Now().Add(s.o.StartTimeout)
	for time.Now().Before(deadline) {
		if strings.Contains(s.Log(), "Connected to the server") {
			return nil
		}
		select {
		case <-done:
			return errors.New("the supervisor exited")
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("not connected within %s", s.o.StartTimeout)
}

// Stop stops the supervisor with SIGINT (the only signal on which it also
// stops its collector), then kills the process group if it has not
// exited within 30 s. It may be called more than once.
func (s *Supervisor) Stop() error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return errors.New("the supervisor ignored SIGINT for 30 s; killed")
	}
	// The collector, should it have outlived its supervisor.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	return nil
}

// InstanceUID is the agent's instance uid as myriarchd shows it; the
// supervisor persists it in its storage directory on its first start.
func (s *Supervisor) InstanceUID() string {
	b, err := os.ReadFile(filepath.Join(s.dir, "storage", "persistent_state.yaml"))
	if err != nil {
		s.t.Fatalf("reading the supervisor's instance id: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "instance_id:"); ok {
			return strings.Trim(strings.TrimSpace(v), `"'`)
		}
	}
	s.t.Fatalf("no instance_id in the supervisor's persistent state:\n%s", b)
	return ""
}

// Log is what the supervisor (and the collector through it) logged.
func (s *Supervisor) Log() string {
	s.mu.Lock()
	l := s.log
	s.mu.Unlock()
	if l == nil {
		return ""
	}
	return l.String()
}

// CollectorLog is the end of what the supervisor's last collector wrote
// (the supervisor keeps it in its storage directory, agent.log).
func (s *Supervisor) CollectorLog() string {
	b, err := os.ReadFile(filepath.Join(s.dir, "storage", "agent.log"))
	if err != nil {
		return err.Error()
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago,
// for a collector receiver or a server the agent must find again after a
// restart.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// PipelineConfig is a valid collector config: an OTLP/HTTP receiver on
// port and a debug exporter in a traces pipeline. The pipeline is named
// traces/otlp, not traces: the supervisor validates a new config
// (Options.ValidateConfig) with the collector's running config file
// passed after it, so a pipeline of the same name in the running config
// (the supervisor's own nop traces pipeline, present whenever its
// feature-gate probe lost the collector's output) replaces the new one's
// and hides its errors.
func PipelineConfig(port int) string {
	return fmt.Sprintf(`receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:%d
exporters:
  debug:
    verbosity: basic
service:
  pipelines:
    traces/otlp:
      receivers: [otlp]
      exporters: [debug]
`, port)
}

// BrokenPipelineConfig is a well-formed YAML config that the collector
// refuses: its pipeline names an exporter that is not configured.
func BrokenPipelineConfig(port int) string {
	return strings.Replace(PipelineConfig(port), "exporters: [debug]", "exporters: [debug, otlp/missing]", 1)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
