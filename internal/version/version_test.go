package version

import (
	"bytes"
	"encoding/json"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/myriarch/myriarch/internal/cli"
)

func TestResolution(t *testing.T) {
	rev := []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"}}
	for _, c := range []struct {
		name, linked string
		bi           *debug.BuildInfo
		want         string
	}{
		{"no build info", "", nil, "dev"},
		{"linker wins", "v1.2.3", &debug.BuildInfo{Main: debug.Module{Version: "v0.9.0"}, Settings: rev}, "v1.2.3"},
		{"module version", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.9.0"}, Settings: rev}, "v0.9.0"},
		{"revision, dirty", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: rev}, "dev-0123456789ab+dirty"},
		{"nothing recorded", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "dev"},
	} {
		if got := fromBuildInfo(c.linked, c.bi).Version; got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	line := fromBuildInfo("v1.2.3", &debug.BuildInfo{GoVersion: "go1.26.8", Settings: rev}).Line("prog")
	if want := "prog v1.2.3 (0123456789ab) go1.26.8 "; !strings.HasPrefix(line, want) {
		t.Errorf("line %q, want prefix %q", line, want)
	}
}

func TestCommand(t *testing.T) {
	r := &cli.Registry{Program: "prog"}
	Register(r)
	for _, args := range [][]string{{"version"}, {"--version"}} {
		var out, errOut bytes.Buffer
		if code := r.Dispatch(args, &out, &errOut); code != 0 || !strings.HasPrefix(out.String(), "prog "+String()+" ") {
			t.Errorf("%v: exit %d, %q %q", args, code, out.String(), errOut.String())
		}
	}
	var out bytes.Buffer
	if code := r.Dispatch([]string{"version", "--json"}, &out, &out); code != 0 {
		t.Fatalf("--json: exit %d: %s", code, out.String())
	}
	var info Info
	if err := json.Unmarshal(out.Bytes(), &info); err != nil || info.Version != String() || info.GoVersion == "" {
		t.Fatalf("--json: %+v %v", info, err)
	}
	if code := r.Dispatch([]string{"version", "extra"}, &out, &out); code != cli.ExitUsage {
		t.Fatalf("extra argument: exit %d", code)
	}
}

func TestCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(Collector("prog", "v1.2.3"))
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || mfs[0].GetName() != MetricBuildInfo {
		t.Fatalf("%v %v", mfs, err)
	}
	m := mfs[0].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if m.GetGauge().GetValue() != 1 || labels["program"] != "prog" || labels["version"] != "v1.2.3" || labels["go_version"] == "" {
		t.Fatalf("metric %v", m)
	}
}
