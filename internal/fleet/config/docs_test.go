package config

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/failover"
	"go.yaml.in/yaml/v3"
)

// The settings table of the operator docs is generated from Settings.
func TestConfigurationDocMatchesTheCode(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), MarkdownTable()) {
		t.Fatalf("docs/configuration.md is out of date; replace its table with:\n%s", MarkdownTable())
	}
}

// The Helm chart's defaults are the spec's and give the formula's 90 s.
func TestHelmDefaultsFollowTheSpec(t *testing.T) {
	raw, err := os.ReadFile("../../../deploy/helm/myriarchd/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		ReplicaCount        int    `yaml:"replicaCount"`
		PreStopSleepSeconds int    `yaml:"preStopSleepSeconds"`
		Grace               string `yaml:"terminationGracePeriodSeconds"`
		Config              struct {
			HA     map[string]any `yaml:"ha"`
			Server map[string]any `yaml:"server"`
		} `yaml:"config"`
	}
	if err := yaml.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if v.ReplicaCount != 2 || v.Grace != "" {
		t.Fatalf("replicas %d, grace %q (must be derived by default)", v.ReplicaCount, v.Grace)
	}
	def := func(key string) string { s, _ := Lookup(key); return s.Default }
	if v.Config.HA["leaderSessionTimeout"] != def("ha.leaderSessionTimeout") || v.Config.Server["shutdownTimeout"] != def("server.shutdownTimeout") {
		t.Fatalf("chart config %+v differs from the defaults", v.Config)
	}
	shutdown, _ := time.ParseDuration(v.Config.Server["shutdownTimeout"].(string))
	g, err := TerminationGracePeriod(time.Duration(v.PreStopSleepSeconds)*time.Second, shutdown)
	if err != nil || g != 90*time.Second || DefaultPreStopSleep != 10*time.Second || v.PreStopSleepSeconds != 10 {
		t.Fatalf("grace %v %v (preStop %d)", g, err, v.PreStopSleepSeconds)
	}
	// That the template computes the same formula, for any shutdownTimeout,
	// is checked by rendering it: deploy/chart_test.go.
	if FinalFlushDeadline != 15*time.Second || failover.LeaderReleaseBound != 5*time.Second {
		t.Fatal("the chart hard-codes 15 and 5")
	}
	// systemd: no preStop sleep, so 2 × 30 + 15 + 5 = 80.
	unit, _ := os.ReadFile("../../../deploy/systemd/myriarchd.service")
	g, _ = TerminationGracePeriod(0, shutdown)
	if m := regexp.MustCompile(`(?m)^TimeoutStopSec=(\d+)$`).FindStringSubmatch(string(unit)); m == nil || m[1] != "80" || g != 80*time.Second {
		t.Fatalf("systemd TimeoutStopSec %v, formula %v", m, g)
	}
}
