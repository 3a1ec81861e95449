package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
)

const module = "github.com/myriarch/myriarch"

// pkg is the part of `go list -json` the rules read.
type pkg struct {
	ImportPath string
	Imports    []string // direct imports, non-test files
	Deps       []string // every package linked, transitively
}

// The production binaries: what operators run. cmd/myriarch-lab and
// cmd/myriarch-loadagents are lab and load tools and may link labs.
var productionBinaries = []string{module + "/cmd/myriarch-bridge", module + "/cmd/myriarchd"}

// libraries may be imported by other modules: they speak their own words
// and import nothing of the daemons.
var libraries = []string{module + "/failover", module + "/lease", module + "/pgleader"}

// labMachinery are the packages a production binary must not link: test
// helpers, labs, embedded servers that exist for tests and labs.
var labMachinery = []string{
	"testing",
	module + "/internal/pgtest",
	module + "/internal/testnet",
	module + "/internal/faultnet",
	module + "/lease/etcdtest",
	module + "/internal/fleet/otelagent",
	module + "/internal/fleet/artifacts/blobstore/s3test",
	module + "/internal/fleet/releases/ocitest",
	module + "/internal/testpki",
	module + "/internal/testwait",
	module + "/internal/leaderlab",
	module + "/internal/proof",
	module + "/internal/anchorlab",
	module + "/internal/bridge/lab",
	module + "/internal/bridge/embroker",
	module + "/internal/bridge/bench",
	module + "/internal/bridge/sender/sendertest",
	module + "/internal/bridge/sender/amqp/amqptest",
	module + "/internal/bridge/sender/sqs/sqstest",
	module + "/internal/fleet/fleettest",
	module + "/lease/leasetest",
	module + "/lease/internal/leasesim",
	"go.etcd.io/etcd/server/v3/embed",
	"github.com/mochi-mqtt/server/v2",
}

// testingImporters are third-party packages that import "testing" from a
// non-test file, so a binary that needs them links it; our own code never
// may. opamp-go's client ships a mock server (client/internal/mockserver.go)
// in the package its client needs.
var testingImporters = map[string]string{
	"github.com/open-telemetry/opamp-go/client/internal": "upstream client/internal/mockserver.go imports testing",
}

var (
	graphOnce sync.Once
	graph     map[string]pkg
	graphErr  error
)

// load lists every package of the module and of the production binaries
// with its direct imports and transitive dependencies.
func load(t *testing.T) map[string]pkg {
	t.Helper()
	graphOnce.Do(func() {
		cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Imports,Deps", "./...")
		cmd.Dir = "../.."
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			graphErr = fmt.Errorf("go list: %v\n%s", err, stderr.String())
			return
		}
		graph = map[string]pkg{}
		dec := json.NewDecoder(bytes.NewReader(out))
		for {
			var p pkg
			if err := dec.Decode(&p); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				graphErr = err
				return
			}
			graph[p.ImportPath] = p
		}
	})
	if graphErr != nil {
		t.Fatal(graphErr)
	}
	return graph
}

func within(path, root string) bool { return path == root || strings.HasPrefix(path, root+"/") }

func withinAny(path string, roots []string) bool {
	return slices.ContainsFunc(roots, func(r string) bool { return within(path, r) })
}

// checkLibraries: a library imports nothing under internal/ or cmd/ of the
// module (its own internal packages, such as lease/internal, are its own).
func checkLibraries(g map[string]pkg) []string {
	var bad []string
	for _, p := range sorted(g) {
		if !withinAny(p.ImportPath, libraries) {
			continue
		}
		for _, d := range p.Deps {
			if within(d, module+"/internal") || within(d, module+"/cmd") {
				bad = append(bad, fmt.Sprintf("library %s links %s (libraries import no daemon code)", p.ImportPath, d))
			}
		}
	}
	return bad
}

// checkDaemonsApart: nothing of the bridge links the fleet and nothing of
// the fleet links the bridge, directly or through a shared package.
func checkDaemonsApart(g map[string]pkg) []string {
	bridge, fleet := module+"/internal/bridge", module+"/internal/fleet"
	var bad []string
	for _, p := range sorted(g) {
		var other string
		switch {
		case within(p.ImportPath, bridge):
			other = fleet
		case within(p.ImportPath, fleet):
			other = bridge
		default:
			continue
		}
		for _, d := range p.Deps {
			if within(d, other) {
				bad = append(bad, fmt.Sprintf("%s links %s%s (the bridge and the fleet never import each other; the composition root in cmd/ wires them)", p.ImportPath, d, via(g, p.ImportPath, d)))
				break
			}
		}
	}
	return bad
}

// checkBinaries: a production binary links no test or lab machinery, and
// "testing" only through the listed third-party packages.
func checkBinaries(g map[string]pkg) []string {
	var bad []string
	for _, bin := range productionBinaries {
		p, ok := g[bin]
		if !ok {
			bad = append(bad, "production binary "+bin+" is not in the package graph")
			continue
		}
		for _, d := range p.Deps {
			if !withinAny(d, labMachinery) {
				continue
			}
			if d == "testing" {
				if importers := testingImportersIn(g, p.Deps); len(importers) > 0 {
					bad = append(bad, fmt.Sprintf("%s links testing through %s", bin, strings.Join(importers, ", ")))
				}
				continue
			}
			bad = append(bad, fmt.Sprintf("%s links %s%s (production binaries link no test or lab machinery; labs are cmd/myriarch-lab)", bin, d, via(g, bin, d)))
		}
	}
	return bad
}

// testingImportersIn are the packages among deps that import "testing"
// from a non-test file and are not listed in testingImporters.
func testingImportersIn(g map[string]pkg, deps []string) []string {
	var out []string
	for _, d := range deps {
		if _, listed := testingImporters[d]; listed {
			continue
		}
		if slices.Contains(g[d].Imports, "testing") {
			out = append(out, d)
		}
	}
	return out
}

// via names one chain of imports from -> to, for a readable failure.
func via(g map[string]pkg, from, to string) string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur == to {
			var chain []string
			for c := to; c != ""; c = prev[c] {
				chain = append(chain, c)
			}
			slices.Reverse(chain)
			return " via " + strings.Join(chain, " → ")
		}
		for _, n := range g[cur].Imports {
			if _, seen := prev[n]; !seen {
				prev[n] = cur
				queue = append(queue, n)
			}
		}
	}
	return ""
}

func sorted(g map[string]pkg) []pkg {
	out := make([]pkg, 0, len(g))
	for _, p := range g {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b pkg) int { return strings.Compare(a.ImportPath, b.ImportPath) })
	return out
}

var rules = []struct {
	name  string
	check func(map[string]pkg) []string
}{
	{"libraries import no daemon code", checkLibraries},
	{"bridge and fleet never import each other", checkDaemonsApart},
	{"production binaries link no test or lab machinery", checkBinaries},
}

func TestLayers(t *testing.T) {
	g := load(t)
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			for _, v := range r.check(g) {
				t.Error(v)
			}
		})
	}
}

// plant adds an import from -> to (and its dependencies) to a copy of g,
// as if one file of from imported to.
func plant(g map[string]pkg, from, to string) map[string]pkg {
	c := make(map[string]pkg, len(g))
	for k, v := range g {
		c[k] = v
	}
	add := append([]string{to}, g[to].Deps...)
	// Every package that links from now links to as well.
	for k, v := range c {
		if k == from || slices.Contains(v.Deps, from) {
			v.Deps = append(slices.Clone(v.Deps), add...)
			if k == from {
				v.Imports = append(slices.Clone(v.Imports), to)
			}
			c[k] = v
		}
	}
	return c
}

// Each rule fails on a planted violation of it, in the real graph.
func TestLayersCatchPlantedViolations(t *testing.T) {
	g := load(t)
	for _, tc := range []struct {
		rule, from, to, want string
	}{
		{"libraries import no daemon code", module + "/failover", module + "/internal/godur", "library " + module + "/failover links " + module + "/internal/godur"},
		{"libraries import no daemon code", module + "/pgleader", module + "/cmd/myriarchd", "library " + module + "/pgleader links"},
		{"bridge and fleet never import each other", module + "/internal/fleet/configs", module + "/internal/bridge/config", module + "/internal/fleet/configs links " + module + "/internal/bridge/"},
		{"bridge and fleet never import each other", module + "/internal/bridge/runtime", module + "/internal/fleet/config", module + "/internal/bridge/runtime links " + module + "/internal/fleet/config"},
		{"production binaries link no test or lab machinery", module + "/internal/bridge/runtime", module + "/internal/pgtest", module + "/cmd/myriarch-bridge links " + module + "/internal/pgtest"},
		{"production binaries link no test or lab machinery", module + "/internal/fleet/daemon", module + "/internal/bridge/embroker", "github.com/mochi-mqtt/server/v2"},
		{"production binaries link no test or lab machinery", module + "/internal/fleet/api", module + "/internal/fleet/fleettest", module + "/cmd/myriarchd links " + module + "/internal/fleet/fleettest"},
	} {
		if _, ok := g[tc.to]; !ok {
			t.Fatalf("%s is not in the graph", tc.to)
		}
		idx := slices.IndexFunc(rules, func(r struct {
			name  string
			check func(map[string]pkg) []string
		}) bool {
			return r.name == tc.rule
		})
		if before := rules[idx].check(g); len(before) > 0 {
			t.Fatalf("%s already fails: %v", tc.rule, before)
		}
		got := strings.Join(rules[idx].check(plant(g, tc.from, tc.to)), "\n")
		if !strings.Contains(got, tc.want) {
			t.Errorf("planted %s → %s: rule %q reported %q, want it to contain %q", tc.from, tc.to, tc.rule, got, tc.want)
		}
	}
}
