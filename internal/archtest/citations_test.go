package archtest

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// citedDocs matches a Go comment's reference to a document of the
// repository: docs/<page>.md, README.md or a bare DESIGN.md.
var citedDocs = regexp.MustCompile(`\b((?:docs/[a-z0-9_-]+|README|DESIGN)\.md)\b`)

// citationsIn returns the documents a Go source cites that do not exist
// under root.
func citationsIn(root, src string) []string {
	var missing []string
	for _, m := range citedDocs.FindAllStringSubmatch(src, -1) {
		if _, err := os.Stat(filepath.Join(root, m[1])); err != nil {
			missing = append(missing, m[1])
		}
	}
	return missing
}

// A comment that sends the reader to a document sends them to one that
// exists in the repository: the last round cited DESIGN.md, which is not
// in it.
func TestCodeCitesOnlyDocsThatExist(t *testing.T) {
	root := "../.."
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		// This file names missing documents on purpose.
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "archtest/citations_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, doc := range citationsIn(root, string(b)) {
			t.Errorf("%s cites %s, which is not in the repository", strings.TrimPrefix(path, "../../"), doc)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestCitationCheckSeesAMissingDoc(t *testing.T) {
	got := citationsIn("../..", "// see DESIGN.md and docs/failover-budget.md and docs/nope.md")
	if len(got) != 2 || got[0] != "DESIGN.md" || got[1] != "docs/nope.md" {
		t.Fatalf("missing = %v, want [DESIGN.md docs/nope.md]", got)
	}
}
