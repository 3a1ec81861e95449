package image

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// VersionVar is the linker symbol that carries the version into the binaries.
const VersionVar = "github.com/myriarch/myriarch/internal/version.version"

// BuildBinaries builds static binaries of the daemons into dir with go
// (CGO_ENABLED=0, -trimpath, the version linked in) for goos/goarch, from
// the module rooted at moduleDir. It returns the paths by daemon name.
func BuildBinaries(ctx context.Context, moduleDir, dir, version, goos, goarch string, daemons []Daemon) (map[string]string, error) {
	args := []string{"build", "-trimpath", "-ldflags", "-s -w -X " + VersionVar + "=" + version, "-o", dir + string(filepath.Separator)}
	for _, d := range daemons {
		args = append(args, "./cmd/"+d.Name)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = moduleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	paths := map[string]string{}
	for _, d := range daemons {
		paths[d.Name] = filepath.Join(dir, d.Name)
	}
	return paths, nil
}
