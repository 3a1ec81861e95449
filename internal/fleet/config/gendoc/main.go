// Command gendoc rewrites the settings table of docs/configuration.md from
// config.Settings (run by `go generate ./...`, i.e. `make docs`).
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/myriarch/myriarch/internal/fleet/config"
)

const (
	begin = "<!-- generated from internal/fleet/config.Settings; a test checks that this table matches the code -->\n"
	end   = "<!-- end of generated table -->"
)

func main() {
	path := "../../../docs/configuration.md"
	if len(os.Args) > 1 {
		path = os.Args[1]
	}
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	s := string(b)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		fmt.Fprintln(os.Stderr, path+": generated-table markers not found")
		os.Exit(1)
	}
	s = s[:i+len(begin)] + config.MarkdownTable() + s[j:]
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
