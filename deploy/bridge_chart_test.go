package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/stopbound"
	"github.com/myriarch/myriarch/internal/image"
)

const bridgeChartDir = "helm/myriarch-bridge"

func renderBridge(t *testing.T, set string) map[string]map[string]any {
	t.Helper()
	objs, err := renderDir(t, bridgeChartDir, set)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func bridgePodSpec(t *testing.T, objs map[string]map[string]any) map[string]any {
	t.Helper()
	return dig(t, objs["statefulset.yaml"], "spec", "template", "spec").(map[string]any)
}

// The grace period is stopbound.Stop of the configured shutdown_timeout,
// 40 seconds at the default, for any duration the bridge accepts.
func TestBridgeChartGracePeriodFollowsTheFormula(t *testing.T) {
	want, err := stopbound.Stop(config.DefaultShutdownTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if got := bridgePodSpec(t, renderBridge(t, ""))["terminationGracePeriodSeconds"]; got != want.Seconds() || got != 40.0 {
		t.Fatalf("default terminationGracePeriodSeconds %v, want %v (40)", got, want)
	}
	for _, s := range []string{"1s", "45s", "2m", "1m30s", "1500ms", "2.5m", "10m"} {
		d, _ := time.ParseDuration(s)
		want, err := stopbound.Stop(d)
		if err != nil {
			t.Fatal(err)
		}
		got := bridgePodSpec(t, renderBridge(t, fmt.Sprintf("config: {bridge: {shutdown_timeout: %q}}", s)))["terminationGracePeriodSeconds"]
		if got != want.Seconds() {
			t.Errorf("shutdown_timeout %s: terminationGracePeriodSeconds %v, want %v", s, got, want.Seconds())
		}
	}
	for _, bad := range []string{"30", "1d", "-1m"} {
		_, err := renderDir(t, bridgeChartDir, fmt.Sprintf("config: {bridge: {shutdown_timeout: %q}}", bad))
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("duration %q", bad)) {
			t.Errorf("shutdown_timeout %q: %v", bad, err)
		}
	}
	if got := bridgePodSpec(t, renderBridge(t, "terminationGracePeriodSeconds: 200"))["terminationGracePeriodSeconds"]; got != 200.0 {
		t.Fatalf("explicit terminationGracePeriodSeconds: %v", got)
	}
}

// The chart renders every object, runs N replicas of one bridge id with
// probes on the port the configuration listens on, and its config is one
// that `myriarch-bridge check` admits.
func TestBridgeChartObjectsAndConfig(t *testing.T) {
	objs := renderBridge(t, "replicaCount: 3\nserviceMonitor: {enabled: true}\nprometheusRule: {enabled: true}\nsecret: {env: {MQTT_PASSWORD: pw}}")
	for _, f := range []string{"statefulset.yaml", "configmap.yaml", "secret.yaml", "service.yaml", "pdb.yaml", "servicemonitor.yaml", "prometheusrule.yaml"} {
		if objs[f] == nil {
			t.Errorf("%s not rendered", f)
		}
	}
	if got := dig(t, objs["statefulset.yaml"], "spec", "replicas"); got != 3.0 {
		t.Errorf("replicas %v", got)
	}
	c := dig(t, bridgePodSpec(t, objs), "containers", 0).(map[string]any)
	if got := dig(t, c, "livenessProbe", "httpGet", "path"); got != "/live" {
		t.Errorf("liveness %v", got)
	}
	if got := dig(t, c, "readinessProbe", "httpGet", "path"); got != "/ready" {
		t.Errorf("readiness %v", got)
	}
	if got := dig(t, c, "ports", 0, "containerPort"); got != 9464.0 {
		t.Errorf("port %v", got)
	}
	if got := dig(t, c, "env", 0, "valueFrom", "secretKeyRef", "key"); got != "env.MQTT_PASSWORD" {
		t.Errorf("env from secret: %v", got)
	}
	if got := dig(t, objs["secret.yaml"], "stringData", "env.MQTT_PASSWORD"); got != "pw" {
		t.Errorf("secret env: %v", got)
	}

	text := dig(t, objs["configmap.yaml"], "data", "bridge.yaml").(string)
	var cfgMap map[string]any
	if err := yaml.Unmarshal([]byte(text), &cfgMap); err != nil {
		t.Fatal(err)
	}
	if got := dig(t, cfgMap, "bridge", "http", "listen"); got != ":9464" {
		t.Errorf("http.listen %v, want the probes' port", got)
	}
	if got := dig(t, cfgMap, "bridge", "state_dir"); got != "/var/lib/myriarch-bridge" {
		t.Errorf("state_dir %v, want the data volume", got)
	}
	// The secret files are mounted at /etc/myriarch-bridge/secrets.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "lease-dsn"), []byte(dig(t, objs["secret.yaml"], "stringData", "lease-dsn").(string)), 0o600); err != nil {
		t.Fatal(err)
	}
	text = strings.ReplaceAll(text, "/etc/myriarch-bridge/secrets/", dir+"/")
	cfg, problems := config.Check(filepath.Join(dir, "bridge.yaml"), []byte(text))
	if len(problems) > 0 {
		t.Fatalf("the bridge refuses the chart's config:\n%s\n%v", text, problems)
	}
	if cfg.Bridge.DeploymentMode != "clustered" || cfg.LeaseStore.Type != "postgres" || len(cfg.Exclusive) != 1 {
		t.Fatalf("the default is not one clustered exclusive session on PostgreSQL: %+v", cfg.Bridge)
	}
}

// The alerts' thresholds come from the configuration: the largest
// failover_slo of the routes, in whole seconds.
func TestBridgeChartAlertThresholds(t *testing.T) {
	rules := func(set string) map[string]map[string]any {
		if !strings.Contains(set, "prometheusRule") {
			set = "prometheusRule: {enabled: true}\n" + set
		}
		objs := renderBridge(t, set)
		out := map[string]map[string]any{}
		for _, r := range dig(t, objs["prometheusrule.yaml"], "spec", "groups", 0, "rules").([]any) {
			r := r.(map[string]any)
			out[r["alert"].(string)] = r
		}
		return out
	}
	threshold := regexp.MustCompile(`> ([0-9]+)\s*$`)
	for set, want := range map[string]int{
		"": 600,
		"config: {routes: [{id: a, receiver: telemetry, senders: [upstream], failover_slo: 2m30s}, {id: b, receiver: telemetry, senders: [upstream], failover_slo: 400500ms}]}": 401,
		"prometheusRule: {enabled: true, failoverSLO: 5m}": 300,
	} {
		r := rules(set)
		m := threshold.FindStringSubmatch(r["MyriarchBridgeFailoverOverSLO"]["expr"].(string))
		if m == nil {
			t.Fatalf("%q: no threshold in %q", set, r["MyriarchBridgeFailoverOverSLO"]["expr"])
		}
		if got, _ := strconv.Atoi(m[1]); got != want {
			t.Errorf("%q: failover threshold %d, want %d", set, got, want)
		}
		if got := r["MyriarchBridgeSessionNoOwner"]["for"]; got != fmt.Sprintf("%ds", want) {
			t.Errorf("%q: no-owner for %v, want %ds", set, got, want)
		}
	}
	// The spool alert's threshold: 15m by default, else prometheusRule.spoolOldestAge.
	spoolAge := regexp.MustCompile(`myriarch_bridge_spool_oldest_age_seconds\{[^}]*\}\) > ([0-9]+)\s*$`)
	for set, want := range map[string]string{"": "900", "prometheusRule: {enabled: true, spoolOldestAge: 2h30m}": "9000"} {
		e := rules(set)["MyriarchBridgeSpoolOldestAge"]["expr"].(string)
		if m := spoolAge.FindStringSubmatch(e); m == nil || m[1] != want {
			t.Errorf("%q: spool alert %q, want threshold %s", set, e, want)
		}
	}
	for _, a := range []string{"MyriarchBridgeFailoverOverSLO", "MyriarchBridgeBrokerHealthStepDown", "MyriarchBridgeSessionNoOwner",
		"MyriarchBridgeServiceBelowFull", "MyriarchBridgeDeadLetters", "MyriarchBridgeLeaseRenewFailures", "MyriarchBridgeSpoolOldestAge"} {
		r, ok := rules("")[a]
		if !ok {
			t.Errorf("alert %s missing", a)
			continue
		}
		if rb, _ := dig(t, r, "annotations", "runbook").(string); len(rb) < 100 {
			t.Errorf("alert %s: runbook %q", a, rb)
		}
	}
}

// systemd restarts the bridge after a broker-path step-down (exit 3) and
// lets it stop for stopbound.Stop of the default shutdown_timeout.
func TestBridgeSystemdUnit(t *testing.T) {
	b, err := os.ReadFile("systemd/myriarch-bridge.service")
	if err != nil {
		t.Fatal(err)
	}
	key := func(k string) string {
		m := regexp.MustCompile(`(?m)^` + k + `=(.*)$`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("no %s", k)
		}
		return string(m[1])
	}
	want, err := stopbound.Stop(config.DefaultShutdownTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if got := key("TimeoutStopSec"); got != strconv.Itoa(int(want.Seconds())) {
		t.Errorf("TimeoutStopSec=%s, want %v", got, want.Seconds())
	}
	if got := key("Restart"); got != "on-failure" {
		t.Errorf("Restart=%s", got)
	}
	if regexp.MustCompile(`(?m)^(RestartPreventExitStatus|SuccessExitStatus)=.*\b3\b`).Match(b) {
		t.Error("exit status 3 (broker-path step-down) must restart the bridge")
	}
	if !strings.Contains(key("ExecStart"), "myriarch-bridge run -c /etc/myriarch-bridge/bridge.yaml") {
		t.Errorf("ExecStart=%s", key("ExecStart"))
	}
}

// The charts' default image is what `make image` builds: the repository,
// the tag (the charts' appVersion, which the Makefile passes) and the user.
func TestChartsRunTheImagesMakeImageBuilds(t *testing.T) {
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^VERSION \?= .*deploy/helm/myriarchd/Chart.yaml`).Match(mk) {
		t.Error("make image does not tag with the chart's appVersion")
	}
	var versions []any
	for _, c := range []struct{ dir, name, pod string }{
		{chartDir, "myriarchd", "deployment.yaml"},
		{bridgeChartDir, "myriarch-bridge", "statefulset.yaml"},
	} {
		meta := readYAML(t, filepath.Join(c.dir, "Chart.yaml"))
		versions = append(versions, meta["appVersion"])
		objs, err := renderDir(t, c.dir, "")
		if err != nil {
			t.Fatal(err)
		}
		spec := dig(t, objs[c.pod], "spec", "template", "spec")
		want := image.Ref(image.Daemon{Name: c.name}, meta["appVersion"].(string))
		if got := dig(t, spec, "containers", 0, "image"); got != want {
			t.Errorf("%s: image %v, want %s", c.dir, got, want)
		}
		if got := dig(t, spec, "securityContext", "runAsUser"); got != float64(image.UID) {
			t.Errorf("%s: runAsUser %v, want the image's %d", c.dir, got, image.UID)
		}
	}
	if versions[0] != versions[1] {
		t.Errorf("appVersions %v differ; make image tags both images with one", versions)
	}
}

// The clustered examples run in the chart as they are: their file as
// config:, their secrets under secret:. helm merges them over the chart's
// default configuration, as this renderer does.
func TestBridgeChartRunsTheClusteredExamples(t *testing.T) {
	t.Setenv("MYRIARCH_SOURCE_PASSWORD", "pw")
	for _, ex := range []string{"clustered-postgres.yaml", "clustered-etcd.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "examples", ex))
		if err != nil {
			t.Fatal(err)
		}
		var cfg map[string]any
		if err := yaml.Unmarshal(b, &cfg); err != nil {
			t.Fatal(err)
		}
		values, err := yaml.Marshal(map[string]any{
			"config": cfg,
			"secret": map[string]any{
				"files": map[string]any{"lease-dsn": "postgres://bridge@db/bridge", "cloud-password": "pw"},
				"env":   map[string]any{"MYRIARCH_SOURCE_PASSWORD": "pw"},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		objs := renderBridge(t, string(values))
		text := dig(t, objs["configmap.yaml"], "data", "bridge.yaml").(string)
		dir := t.TempDir()
		for _, f := range []string{"lease-dsn", "cloud-password"} {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(dig(t, objs["secret.yaml"], "stringData", f).(string)), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		text = strings.ReplaceAll(text, "/etc/myriarch-bridge/secrets/", dir+"/")
		got, problems := config.Check(filepath.Join(dir, "bridge.yaml"), []byte(text))
		if len(problems) > 0 {
			t.Errorf("%s in the chart: %v\n%s", ex, problems, text)
			continue
		}
		want, err := stopbound.Stop(got.Bridge.ShutdownTimeout)
		if err != nil {
			t.Fatal(err)
		}
		if g := bridgePodSpec(t, objs)["terminationGracePeriodSeconds"]; g != want.Seconds() {
			t.Errorf("%s: grace %v, want %v", ex, g, want.Seconds())
		}
	}
}
