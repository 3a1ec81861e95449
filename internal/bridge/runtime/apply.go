package runtime

import (
	"context"
	"fmt"
	"os"

	"github.com/myriarch/myriarch/internal/bridge/config"
)

// ApplyFile validates data exactly like `myriarch-bridge check` (admission
// included) as the configuration file at path, and reloads the bridge
// with it. With write set, data replaces the file atomically first, so
// that a restart keeps what was applied; a reload that then fails puts
// the previous file back. A refused configuration changes nothing; its
// error is config.Problems, every problem on its own line.
//
// SIGHUP applies the file itself (write false); a remote configuration
// from myriarchd is written.
func (b *Bridge) ApplyFile(ctx context.Context, path string, data []byte, write bool) (config.Diff, error) {
	cfg, problems := config.Check(path, data)
	if len(problems) > 0 {
		return config.Diff{}, problems
	}
	b.mu.Lock()
	old := b.cfg
	b.mu.Unlock()
	if d, ps := config.Compare(old, cfg); len(ps) > 0 {
		return d, ps
	}
	var previous []byte
	if write {
		var err error
		if previous, err = os.ReadFile(path); err != nil {
			return config.Diff{}, fmt.Errorf("reading the current file: %w", err)
		}
		if err := config.WriteFileAtomic(path, data); err != nil {
			return config.Diff{}, fmt.Errorf("writing %s: %w", path, err)
		}
	}
	d, err := b.Reload(ctx, cfg)
	if err != nil && write {
		if rerr := config.WriteFileAtomic(path, previous); rerr != nil {
			b.log.Error("restoring the configuration file after a failed reload", "file", path, "err", rerr)
		}
	}
	return d, err
}
