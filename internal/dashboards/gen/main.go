// Command gen writes the dashboards of internal/dashboards as JSON files.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/myriarch/myriarch/internal/dashboards"
)

func main() {
	out := flag.String("out", ".", "directory")
	flag.Parse()
	for _, d := range dashboards.All {
		db, err := d.Build()
		if err == nil {
			var b []byte
			if b, err = dashboards.JSON(db); err == nil {
				err = os.WriteFile(filepath.Join(*out, d.File), b, 0o644)
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", d.File, err)
			os.Exit(1)
		}
	}
}
