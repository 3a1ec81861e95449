package deploy

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/Masterminds/sprig/v3"
	"sigs.k8s.io/yaml"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/fleet/config"
	"github.com/myriarch/myriarch/pgleader"
)

const chartDir = "helm/myriarchd"

// requiredValues are what each chart needs beyond its values.yaml to
// render: myriarchd requires its secrets (or an existing Secret).
var requiredValues = map[string]string{
	chartDir:       "secret: {databaseURL: 'postgres://myriarch@db/myriarch', enrollmentSecret: 0123456789abcdef}",
	bridgeChartDir: "secret: {files: {lease-dsn: 'postgres://bridge@db/bridge'}}",
}

// renderChart renders every template of the myriarchd chart; see renderDir.
func renderChart(t *testing.T, set string) map[string]map[string]any {
	t.Helper()
	objs, err := render(t, set)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func render(t *testing.T, set string) (map[string]map[string]any, error) {
	t.Helper()
	return renderDir(t, chartDir, set)
}

// renderDir renders every template of the chart in dir the way helm's
// engine does (text/template with sprig's functions and helm's include,
// required and toYaml, values read with sigs.k8s.io/yaml like helm's), with
// set merged over values.yaml. It returns the parsed objects by template
// file. helm_test.go renders the same charts with the real helm.
func renderDir(t *testing.T, chartDir, set string) (map[string]map[string]any, error) {
	t.Helper()
	values := readYAML(t, filepath.Join(chartDir, "values.yaml"))
	for _, s := range []string{requiredValues[chartDir], set} {
		var over map[string]any
		if err := yaml.Unmarshal([]byte(s), &over); err != nil {
			t.Fatal(err)
		}
		merge(values, over)
	}
	meta := readYAML(t, filepath.Join(chartDir, "Chart.yaml"))
	name := meta["name"].(string)
	tpl := template.New("gotpl").Option("missingkey=zero")
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env")
	delete(funcs, "expandenv")
	funcs["include"] = func(name string, data any) (string, error) {
		var b strings.Builder
		err := tpl.ExecuteTemplate(&b, name, data)
		return b.String(), err
	}
	funcs["required"] = func(msg string, v any) (any, error) {
		if s, ok := v.(string); v == nil || ok && s == "" {
			return v, fmt.Errorf("%s", msg)
		}
		return v, nil
	}
	funcs["toYaml"] = func(v any) string {
		b, err := yaml.Marshal(v)
		if err != nil {
			return ""
		}
		return strings.TrimSuffix(string(b), "\n")
	}
	tpl.Funcs(funcs)
	files, err := filepath.Glob(filepath.Join(chartDir, "templates", "*"))
	if err != nil || len(files) == 0 {
		t.Fatal(files, err)
	}
	base := name + "/templates"
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tpl.New(base + "/" + filepath.Base(f)).Parse(string(b)); err != nil {
			t.Fatal(err)
		}
	}
	out := map[string]map[string]any{}
	for _, f := range files {
		file := filepath.Base(f)
		if strings.HasPrefix(file, "_") || !strings.HasSuffix(file, ".yaml") {
			continue
		}
		data := map[string]any{
			"Values":   values,
			"Chart":    map[string]any{"Name": name, "Version": meta["version"], "AppVersion": meta["appVersion"]},
			"Release":  map[string]any{"Name": "fleet", "Namespace": "ops", "Service": "Helm", "IsInstall": true},
			"Template": map[string]any{"Name": base + "/" + file, "BasePath": base},
		}
		var b strings.Builder
		if err := tpl.ExecuteTemplate(&b, base+"/"+file, data); err != nil {
			return nil, fmt.Errorf("rendering %s with %q: %w", file, set, err)
		}
		text := strings.ReplaceAll(b.String(), "<no value>", "")
		if strings.TrimSpace(text) == "" {
			continue
		}
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(text), &obj); err != nil {
			t.Fatalf("%s with %q is not YAML: %v\n%s", file, set, err, text)
		}
		out[file] = obj
	}
	return out, nil
}

func readYAML(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

func merge(dst, src map[string]any) {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				merge(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

// dig follows a path of keys and list indices through a parsed object.
func dig(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("%v: no map at %q", path, k)
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				t.Fatalf("%v: no list element %d", path, k)
			}
			v = l[k]
		}
	}
	return v
}

func gracePeriod(t *testing.T, objs map[string]map[string]any) float64 {
	t.Helper()
	g, ok := dig(t, objs["deployment.yaml"], "spec", "template", "spec", "terminationGracePeriodSeconds").(float64)
	if !ok {
		t.Fatalf("terminationGracePeriodSeconds is not a number: %v", objs["deployment.yaml"])
	}
	return g
}

func seconds(d time.Duration) float64 { return math.Ceil(d.Seconds()) }

// The chart's default grace period is the formula of the high-availability
// guide for its own preStop sleep and shutdown timeout, 90 seconds, and it
// follows the formula for any server.shutdownTimeout that myriarchd
// accepts, also values with fractions or more than one unit.
func TestChartGracePeriodFollowsTheFormula(t *testing.T) {
	values := readYAML(t, filepath.Join(chartDir, "values.yaml"))
	if got := values["preStopSleepSeconds"]; got != config.DefaultPreStopSleep.Seconds() {
		t.Fatalf("preStopSleepSeconds %v, want config.DefaultPreStopSleep %v", got, config.DefaultPreStopSleep)
	}
	want, err := config.TerminationGracePeriod(config.DefaultPreStopSleep, config.DefaultShutdownTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if got := gracePeriod(t, renderChart(t, "")); got != seconds(want) || got != 90 {
		t.Fatalf("default terminationGracePeriodSeconds %v, want %v (90)", got, want)
	}
	for _, c := range []struct {
		preStop  int
		shutdown string
	}{{10, "1s"}, {10, "45s"}, {10, "2m"}, {10, "1m30s"}, {10, "1500ms"}, {10, "2.5m"}, {10, "10m"}, {0, "30s"}, {25, "1m"}} {
		set := fmt.Sprintf("preStopSleepSeconds: %d\nconfig: {server: {shutdownTimeout: %q}}", c.preStop, c.shutdown)
		d, err := time.ParseDuration(c.shutdown)
		if err != nil {
			t.Fatal(err)
		}
		want, err := config.TerminationGracePeriod(time.Duration(c.preStop)*time.Second, d)
		if err != nil {
			t.Fatal(err)
		}
		if got := gracePeriod(t, renderChart(t, set)); got != seconds(want) {
			t.Errorf("preStopSleepSeconds %d, shutdownTimeout %s: terminationGracePeriodSeconds %v, want %v", c.preStop, c.shutdown, got, seconds(want))
		}
	}
	// A duration myriarchd would not accept is refused by name, not
	// turned into a wrong number.
	for _, bad := range []string{"30", "1d", "30 s", "-1m"} {
		_, err := render(t, fmt.Sprintf("config: {server: {shutdownTimeout: %q}}", bad))
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("duration %q", bad)) {
			t.Errorf("shutdownTimeout %q: %v", bad, err)
		}
	}
	// An explicit value wins.
	if got := gracePeriod(t, renderChart(t, "terminationGracePeriodSeconds: 200")); got != 200 {
		t.Fatalf("explicit terminationGracePeriodSeconds: %v", got)
	}
	// The preStop sleep is the one the formula counts.
	objs := renderChart(t, "")
	if got := dig(t, objs["deployment.yaml"], "spec", "template", "spec", "containers", 0, "lifecycle", "preStop", "sleep", "seconds"); got != values["preStopSleepSeconds"] {
		t.Fatalf("preStop sleep %v", got)
	}
}

// The alert fires when no replica has led for longer than the failover
// bound after a hard failure (ha.leaderSessionTimeout, whole seconds), and
// never during a planned or clean handover, which are shorter.
func TestChartNoLeaderAlertUsesTheFailoverBound(t *testing.T) {
	forOf := func(objs map[string]map[string]any) (noLeader, twoLeaders string) {
		rules := dig(t, objs["prometheusrule.yaml"], "spec", "groups", 0, "rules").([]any)
		for _, r := range rules {
			r := r.(map[string]any)
			switch r["alert"] {
			case "MyriarchdNoLeader":
				noLeader = r["for"].(string)
			case "MyriarchdTwoLeaders":
				twoLeaders = r["for"].(string)
			}
		}
		return
	}
	promDur := regexp.MustCompile(`^[0-9]+s$`)
	for _, tv := range []string{"", "10s", "45s", "1m30s", "2.5m", "10m"} {
		set := "prometheusRule: {enabled: true}"
		T := failover.DefaultLeaderSessionTimeout
		if tv != "" {
			set += fmt.Sprintf("\nconfig: {ha: {leaderSessionTimeout: %q}}", tv)
			var err error
			if T, err = time.ParseDuration(tv); err != nil {
				t.Fatal(err)
			}
		}
		k, err := failover.DeriveLeaderKeepalive(T)
		if err != nil {
			t.Fatal(err)
		}
		noLeader, twoLeaders := forOf(renderChart(t, set))
		want := strconv.FormatFloat(seconds(pgleader.HardFailureBound(k)), 'f', -1, 64) + "s"
		if noLeader != want || twoLeaders != want || !promDur.MatchString(noLeader) {
			t.Errorf("T=%v: alert durations %q and %q, want %q", T, noLeader, twoLeaders, want)
			continue
		}
		d, _ := time.ParseDuration(noLeader)
		if d < pgleader.PlannedStopBound(k) || d < pgleader.CleanCloseBound(k) {
			t.Errorf("T=%v: the alert (%v) would fire during a planned handover (%v) or a clean one (%v)",
				T, d, pgleader.PlannedStopBound(k), pgleader.CleanCloseBound(k))
		}
	}
	if noLeader, _ := forOf(renderChart(t, "prometheusRule: {enabled: true, noLeaderFor: 2m}")); noLeader != "2m" {
		t.Fatalf("noLeaderFor override: %q", noLeader)
	}
}

// The chart's config.yaml is one that myriarchd accepts, and the defaults
// it spells out are myriarchd's.
func TestChartConfigIsValid(t *testing.T) {
	objs := renderChart(t, "serviceMonitor: {enabled: true}\nprometheusRule: {enabled: true}")
	for _, f := range []string{"deployment.yaml", "configmap.yaml", "secret.yaml", "service.yaml", "pdb.yaml", "servicemonitor.yaml", "prometheusrule.yaml"} {
		if objs[f] == nil {
			t.Errorf("%s not rendered", f)
		}
	}
	text, _ := dig(t, objs["configmap.yaml"], "data", "config.yaml").(string)
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(config.Source{File: file, Environ: []string{}, Optional: []string{"database.url", "server.enrollmentSecret"}}); err != nil {
		t.Fatalf("myriarchd refuses the chart's config.yaml:\n%s\n%v", text, err)
	}
	var flat map[string]any
	if err := yaml.Unmarshal([]byte(text), &flat); err != nil {
		t.Fatal(err)
	}
	for section, keys := range flat {
		for key, v := range keys.(map[string]any) {
			s, ok := config.Lookup(section + "." + key)
			if !ok {
				t.Errorf("%s.%s: unknown to myriarchd", section, key)
				continue
			}
			got := fmt.Sprint(v)
			if f, ok := v.(float64); ok {
				got = strconv.FormatFloat(f, 'f', -1, 64)
			}
			if section+"."+key == "log.format" {
				continue // the chart logs JSON on purpose
			}
			if got != s.Default {
				t.Errorf("%s: chart says %q, myriarchd's default is %q", s.Key, got, s.Default)
			}
		}
	}
}

// systemd has no preStop sleep: TimeoutStopSec is the formula without it.
func TestSystemdStopTimeoutFollowsTheFormula(t *testing.T) {
	b, err := os.ReadFile("systemd/myriarchd.service")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^TimeoutStopSec=(\d+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no TimeoutStopSec")
	}
	want, err := config.TerminationGracePeriod(0, config.DefaultShutdownTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := strconv.Atoi(string(m[1])); float64(got) != seconds(want) {
		t.Fatalf("TimeoutStopSec=%d, want %v", got, want)
	}
}

// Artifacts in S3: the secret key comes from the chart's Secret into
// MYRIARCH_ARTIFACTS_S3SECRETKEY (optional, so a Secret without it still
// starts), and the rendered config with the Secret's environment is one
// that myriarchd accepts.
func TestChartS3SecretKeyReachesMyriarchd(t *testing.T) {
	plain := renderChart(t, "")
	if _, ok := dig(t, plain["secret.yaml"], "stringData").(map[string]any)["s3-secret-key"]; ok {
		t.Fatal("the Secret carries s3-secret-key although secret.s3SecretKey is empty")
	}
	objs := renderChart(t, "secret: {s3SecretKey: s3-key-0123456789}\nconfig: {artifacts: {store: s3, s3Endpoint: 's3.example:9000', s3Bucket: fleet, s3AccessKey: myriarchd}}")
	stringData := dig(t, objs["secret.yaml"], "stringData").(map[string]any)
	if stringData["s3-secret-key"] != "s3-key-0123456789" {
		t.Fatalf("secret: %v", stringData)
	}
	var ref map[string]any
	env := dig(t, objs["deployment.yaml"], "spec", "template", "spec", "containers", 0, "env").([]any)
	for _, e := range env {
		if e.(map[string]any)["name"] == config.EnvName("artifacts.s3SecretKey") {
			ref = dig(t, e, "valueFrom", "secretKeyRef").(map[string]any)
		}
	}
	if ref == nil || ref["key"] != "s3-secret-key" || ref["optional"] != true {
		t.Fatalf("%s: secretKeyRef %v", config.EnvName("artifacts.s3SecretKey"), ref)
	}
	text, _ := dig(t, objs["configmap.yaml"], "data", "config.yaml").(string)
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	environ := []string{config.EnvName("artifacts.s3SecretKey") + "=" + stringData["s3-secret-key"].(string)}
	c, err := config.Load(config.Source{File: file, Environ: environ, Optional: []string{"database.url", "server.enrollmentSecret"}})
	if err != nil {
		t.Fatalf("myriarchd refuses the chart's S3 config:\n%s\n%v", text, err)
	}
	if c.Artifacts.Store != "s3" || c.Artifacts.S3SecretKey != "s3-key-0123456789" {
		t.Fatalf("artifacts: store %q, secret key set %v", c.Artifacts.Store, c.Artifacts.S3SecretKey != "")
	}
	// Without the key anywhere, myriarchd names what is missing.
	if _, err := config.Load(config.Source{File: file, Environ: []string{}, Optional: []string{"database.url", "server.enrollmentSecret"}}); err == nil ||
		!strings.Contains(err.Error(), "artifacts.s3SecretKey") {
		t.Fatalf("no secret key: %v", err)
	}
}
