package archtest

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// packagesNamed are the package paths a page names in backquotes, alone
// (`internal/bridge/config`) or grouped by braces (`internal/{cli,disclose}`).
func packagesNamed(doc string) map[string]bool {
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`([a-z0-9_./{},-]+)`").FindAllStringSubmatch(doc, -1) {
		for _, p := range expandBraces(m[1]) {
			named[strings.TrimSuffix(p, "/...")] = true
		}
	}
	return named
}

// expandBraces turns a/{b,c}/d into a/b/d and a/c/d (one brace group).
func expandBraces(s string) []string {
	i, j := strings.Index(s, "{"), strings.Index(s, "}")
	if i < 0 || j < i {
		return []string{s}
	}
	var out []string
	for _, alt := range strings.Split(s[i+1:j], ",") {
		out = append(out, s[:i]+alt+s[j+1:])
	}
	return out
}

// Every package of the module is on docs/architecture.md, so that the map
// cannot fall behind the code again.
func TestArchitectureDocNamesEveryPackage(t *testing.T) {
	doc, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	named := packagesNamed(string(doc))
	for _, p := range sorted(load(t)) {
		rel, ok := strings.CutPrefix(p.ImportPath, module+"/")
		if !ok || rel == "examples" || rel == "deploy" {
			continue
		}
		if !named[rel] {
			t.Errorf("docs/architecture.md does not name package %s", rel)
		}
	}
}

func TestArchitectureDocCheckSeesAMissingPackage(t *testing.T) {
	named := packagesNamed("| `internal/{cli,disclose}` | x |\n`lease/etcdtest`")
	for _, want := range []string{"internal/cli", "internal/disclose", "lease/etcdtest"} {
		if !named[want] {
			t.Errorf("%s not seen as named", want)
		}
	}
	if named["internal/bridge/config"] {
		t.Error("a package the text does not name was seen as named")
	}
}
