package releases

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// Recorded reports whether release version of pkg is recorded.
func Recorded(ctx context.Context, q store.Querier, pkg, version string) (bool, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT count(*) FROM package_releases WHERE package = $1 AND version = $2`, pkg, version).Scan(&n)
	return n > 0, err
}

// PlatformAsset returns the asset of release version of pkg for the
// platform os/arch: the one built for it, else the one for all platforms
// (empty os), the first by name; ErrNotFound if it has neither.
func PlatformAsset(ctx context.Context, q store.Querier, pkg, version, os, arch string) (Asset, error) {
	var a Asset
	err := q.QueryRow(ctx, `SELECT a.name, a.os, a.arch, a.digest, a.size, a.url, a.signature
		FROM package_assets a WHERE a.package = $1 AND a.version = $2 AND ((a.os = $3 AND a.arch = $4) OR a.os = '')
		ORDER BY a.os DESC, a.name LIMIT 1`, pkg, version, os, arch).Scan(&a.Name, &a.OS, &a.Arch, &a.Digest, &a.Size, &a.URL, &a.Signature)
	if errors.Is(err, pgx.ErrNoRows) {
		return a, ErrNotFound
	}
	return a, err
}

// AddPolledSource records source s as polled just now (so that the tracker
// polls it only after its poll interval), unless a source of its name
// exists. It is for load tools that record their releases themselves
// (RecordRelease) under a source that cannot be polled.
func AddPolledSource(ctx context.Context, q store.Querier, s Source) error {
	_, err := q.Exec(ctx, `INSERT INTO package_sources (name, type, source, poll_interval_ms, last_polled_at) VALUES ($1, $2, $3, $4, now())
		ON CONFLICT DO NOTHING`, s.Name, s.Type, s.Source, s.PollInterval.Milliseconds())
	return err
}
