package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// helmVersion is the helm the charts are tested with; tools/helm pins it.
const helmVersion = "v3.22.0"

// helmBinary returns the real helm: $HELM, or one built from tools/helm
// (a module of its own, so helm's Kubernetes dependencies stay out of the
// main module) and kept in the user cache directory. Building it the first
// time takes minutes; the Go build cache makes later builds quick.
func helmBinary(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	bin := filepath.Join(cache, "myriarch-test", "helm-"+helmVersion)
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command("go", "build", "-o", bin, "helm.sh/helm/v3/cmd/helm")
	cmd.Dir = "../tools/helm"
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building helm %s from tools/helm: %v\n%s", helmVersion, err, out)
	}
	return bin
}

var helmSets = map[string][]string{
	chartDir:       {"secret.databaseURL=postgres://myriarch@db/myriarch", "secret.enrollmentSecret=0123456789abcdef", "serviceMonitor.enabled=true", "prometheusRule.enabled=true"},
	bridgeChartDir: {"secret.files.lease-dsn=postgres://bridge@db/bridge", "serviceMonitor.enabled=true", "prometheusRule.enabled=true"},
}

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(helmBinary(t), args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	err := cmd.Run()
	if err != nil {
		return out.String() + errb.String(), err
	}
	return out.String(), nil
}

func setArgs(sets []string) []string {
	var args []string
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return args
}

// helm lint --strict accepts both charts.
func TestHelmLint(t *testing.T) {
	for dir, sets := range helmSets {
		out, err := helm(t, append([]string{"lint", "--strict", dir}, setArgs(sets)...)...)
		if err != nil || !strings.Contains(out, "0 chart(s) failed") {
			t.Errorf("helm lint %s: %v\n%s", dir, err, out)
		}
	}
}

// helm template renders every object of both charts exactly as the Go
// renderer of the other tests does, so their checks hold for what helm
// installs; a duration helm cannot read fails the install by name.
func TestHelmTemplateMatchesTheGoRenderer(t *testing.T) {
	source := regexp.MustCompile(`(?m)^# Source: [^/]+/templates/(\S+)$`)
	for dir, sets := range helmSets {
		out, err := helm(t, append([]string{"template", "fleet", dir, "--namespace", "ops"}, setArgs(sets)...)...)
		if err != nil {
			t.Fatalf("helm template %s: %v\n%s", dir, err, out)
		}
		fromHelm := map[string]map[string]any{}
		for _, doc := range strings.Split(out, "\n---\n") {
			m := source.FindStringSubmatch(doc)
			if m == nil {
				continue
			}
			var obj map[string]any
			if err := yaml.Unmarshal([]byte(doc+"\n"), &obj); err != nil {
				t.Fatalf("%s %s: %v", dir, m[1], err)
			}
			fromHelm[m[1]] = obj
		}
		var yamlSets []string
		for _, s := range sets {
			k, v, _ := strings.Cut(s, "=")
			parts := strings.Split(k, ".")
			y := fmt.Sprintf("%q", v)
			for i := len(parts) - 1; i >= 0; i-- {
				y = fmt.Sprintf("{%q: %s}", parts[i], y)
			}
			yamlSets = append(yamlSets, y)
		}
		fromGo, err := renderDir(t, dir, mergeYAML(t, yamlSets))
		if err != nil {
			t.Fatal(err)
		}
		if len(fromHelm) != len(fromGo) {
			t.Errorf("%s: helm renders %d objects, the Go renderer %d", dir, len(fromHelm), len(fromGo))
		}
		for f, obj := range fromHelm {
			if !reflect.DeepEqual(obj, fromGo[f]) {
				h, _ := yaml.Marshal(obj)
				g, _ := yaml.Marshal(fromGo[f])
				t.Errorf("%s %s: helm and the Go renderer differ:\n--- helm\n%s\n--- go\n%s", dir, f, h, g)
			}
		}
		bad := append(setArgs(sets), "--set", "config.server.shutdownTimeout=30", "--set", "config.bridge.shutdown_timeout=30")
		out, err = helm(t, append([]string{"template", "fleet", dir}, bad...)...)
		if err == nil || !strings.Contains(out, `duration "30"`) {
			t.Errorf("%s: a bad duration: %v\n%s", dir, err, out)
		}
	}
}

// mergeYAML merges the --set values into one YAML document.
func mergeYAML(t *testing.T, docs []string) string {
	t.Helper()
	all := map[string]any{}
	for _, d := range docs {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(d), &m); err != nil {
			t.Fatal(err)
		}
		merge(all, m)
	}
	b, err := yaml.Marshal(all)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
