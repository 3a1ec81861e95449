// Command gendocs rewrites the generated tables of the docs in a folder.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/myriarch/myriarch/internal/docgen"
)

func main() {
	dir := flag.String("docs", "docs", "folder of Markdown docs")
	flag.Parse()
	files, err := filepath.Glob(filepath.Join(*dir, "*.md"))
	if err != nil {
		fail(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			fail(err)
		}
		out, err := docgen.Update(string(b))
		if err != nil {
			fail(fmt.Errorf("%s: %w", f, err))
		}
		if out != string(b) {
			if err := os.WriteFile(f, []byte(out), 0o644); err != nil {
				fail(err)
			}
			fmt.Println("updated", f)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "gendocs:", err)
	os.Exit(1)
}
