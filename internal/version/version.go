// Package version names the build of Myriarch's binaries: the version that
// `--version`, the images' labels, OpAMP descriptions and bug reports show.
//
// Release builds set it with the linker:
//
//	go build -ldflags "-X github.com/myriarch/myriarch/internal/version.version=v1.2.3" ./cmd/...
//
// Without that, it falls back to what the Go toolchain recorded: the module
// version for `go install ...@v1.2.3`, else the VCS revision (with "+dirty"
// for a modified tree), else "dev".
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// version is set with -ldflags "-X ...internal/version.version=...".
var version string

// Info is what a build reports about itself.
type Info struct {
	Version   string `json:"version"`
	Revision  string `json:"revision,omitempty"`
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"`
}

// Get returns the build's Info.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return fromBuildInfo(version, bi)
}

// String is the version alone, as Get().Version.
func String() string { return Get().Version }

// fromBuildInfo resolves the version: the linker's value first, then the
// main module's version, then the VCS revision, then "dev".
func fromBuildInfo(linked string, bi *debug.BuildInfo) Info {
	info := Info{Version: linked, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi == nil {
		if info.Version == "" {
			info.Version = "dev"
		}
		return info
	}
	if bi.GoVersion != "" {
		info.GoVersion = bi.GoVersion
	}
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if info.Version != "" {
		return info
	}
	switch {
	case bi.Main.Version != "" && bi.Main.Version != "(devel)":
		info.Version = bi.Main.Version
	case info.Revision != "":
		info.Version = "dev-" + short(info.Revision)
		if dirty {
			info.Version += "+dirty"
		}
	default:
		info.Version = "dev"
	}
	return info
}

func short(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}

// Line is the one-line form `<program> --version` prints.
func (i Info) Line(program string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", program, i.Version)
	if i.Revision != "" && !strings.Contains(i.Version, short(i.Revision)) {
		fmt.Fprintf(&b, " (%s)", short(i.Revision))
	}
	fmt.Fprintf(&b, " %s %s", i.GoVersion, i.Platform)
	return b.String()
}
