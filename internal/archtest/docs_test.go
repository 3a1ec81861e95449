package archtest

import (
	"fmt"
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

// renderOwners is TableOwners as the table of docs/architecture.md: one
// row per owner, its tables in the order of the list.
func renderOwners() string {
	var owners []string
	tables := map[string][]string{}
	for _, o := range TableOwners {
		if _, ok := tables[o.Owner]; !ok {
			owners = append(owners, o.Owner)
		}
		tables[o.Owner] = append(tables[o.Owner], "`"+o.Table+"`")
	}
	var b strings.Builder
	b.WriteString("| Owner | Tables |\n|---|---|\n")
	for _, o := range owners {
		fmt.Fprintf(&b, "| `%s` | %s |\n", o, strings.Join(tables[o], ", "))
	}
	return b.String()
}

const ownersBegin, ownersEnd = "<!-- table-owners:begin -->\n", "<!-- table-owners:end -->"

// The owners table of docs/architecture.md is TableOwners; with
// MYRIARCH_UPDATE_DOCS=1 the test rewrites it.
func TestArchitectureDocTableOwners(t *testing.T) {
	const path = "../../docs/architecture.md"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, ownersBegin), strings.Index(doc, ownersEnd)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the markers %q and %q", path, ownersBegin, ownersEnd)
	}
	want := renderOwners()
	if got := doc[i+len(ownersBegin) : j]; got != want {
		if os.Getenv("MYRIARCH_UPDATE_DOCS") == "1" {
			if err := os.WriteFile(path, []byte(doc[:i+len(ownersBegin)]+want+doc[j:]), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("the table owners of %s differ from archtest.TableOwners (MYRIARCH_UPDATE_DOCS=1 go test -run TestArchitectureDocTableOwners ./internal/archtest rewrites it):\n%s", path, want)
	}
}
