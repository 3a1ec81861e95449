package releases

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// ErrNotFound is returned for an unknown package.
var ErrNotFound = errors.New("not found")

// PutSource validates s and creates or replaces the package's source.
// It is an operator's write through the API, not a leader job's.
func PutSource(ctx context.Context, pool *pgxpool.Pool, s Source) error {
	if err := s.Validate(); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `INSERT INTO package_sources (name, type, source, constraint_expr, poll_interval_ms, public_key)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (name) DO UPDATE SET type = $2, source = $3, constraint_expr = $4, poll_interval_ms = $5, public_key = $6,
			last_polled_at = CASE WHEN package_sources.source = $3 AND package_sources.type = $2 THEN package_sources.last_polled_at END`,
		s.Name, s.Type, s.Source, s.Constraint, s.PollInterval.Milliseconds(), s.PublicKey)
	return err
}

// DeleteSource removes a package with its releases (not its blobs: the
// prefetcher's retention removes those).
func DeleteSource(ctx context.Context, pool *pgxpool.Pool, name string) error {
	tag, err := pool.Exec(ctx, `DELETE FROM package_sources WHERE name = $1`, name)
	if err == nil && tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return err
}

// ListSources returns every package source.
func ListSources(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) ([]Source, error) {
	rows, err := q.Query(ctx, `SELECT name, type, source, constraint_expr, poll_interval_ms, public_key, last_polled_at, last_error
		FROM package_sources ORDER BY name`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Source, error) {
		var s Source
		var ms int64
		err := r.Scan(&s.Name, &s.Type, &s.Source, &s.Constraint, &ms, &s.PublicKey, &s.LastPolledAt, &s.LastError)
		s.PollInterval = time.Duration(ms) * time.Millisecond
		s.PollIntervalS = s.PollInterval.Seconds()
		return s, err
	})
}

func knownVersions(ctx context.Context, pool *pgxpool.Pool, pkg string) (map[string]bool, error) {
	rows, err := pool.Query(ctx, `SELECT version FROM package_releases WHERE package = $1`, pkg)
	if err != nil {
		return nil, err
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	m := map[string]bool{}
	for _, v := range vs {
		m[v] = true
	}
	return m, err
}

// RecordRelease records release r with its assets, written in term, unless
// a release of its package and version is recorded already.
func RecordRelease(ctx context.Context, q store.Querier, r Release, term int64) error {
	tag, err := q.Exec(ctx, `INSERT INTO package_releases (package, version, published_at, term) VALUES ($1, $2, $3, $4)
		ON CONFLICT DO NOTHING`, r.Package, r.Version, r.PublishedAt, term)
	if err != nil || tag.RowsAffected() == 0 {
		return err
	}
	for _, a := range r.Assets {
		if _, err := q.Exec(ctx, `INSERT INTO package_assets (package, version, name, os, arch, digest, size, url, signature)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING`,
			r.Package, r.Version, a.Name, a.OS, a.Arch, a.Digest, a.Size, a.URL, a.Signature); err != nil {
			return fmt.Errorf("recording asset %s of %s %s: %w", a.Name, r.Package, r.Version, err)
		}
	}
	return nil
}

// ListReleases returns the releases of pkg ("" = all), newest version first
// within a package, with their assets.
func ListReleases(ctx context.Context, pool *pgxpool.Pool, pkg string) ([]Release, error) {
	rows, err := pool.Query(ctx, `SELECT r.package, r.version, r.published_at, r.recorded_at,
			coalesce(a.name, ''), coalesce(a.os, ''), coalesce(a.arch, ''), coalesce(a.digest, ''), coalesce(a.size, -1),
			coalesce(a.url, ''), coalesce(a.signature, '')
		FROM package_releases r LEFT JOIN package_assets a ON a.package = r.package AND a.version = r.version
		WHERE $1 = '' OR r.package = $1 ORDER BY r.package, r.version, a.name`, pkg)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Release
	idx := map[[2]string]int{}
	for rows.Next() {
		var r Release
		var a Asset
		if err := rows.Scan(&r.Package, &r.Version, &r.PublishedAt, &r.RecordedAt, &a.Name, &a.OS, &a.Arch, &a.Digest, &a.Size, &a.URL, &a.Signature); err != nil {
			return nil, err
		}
		k := [2]string{r.Package, r.Version}
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, r)
		}
		if a.Name != "" {
			out[i].Assets = append(out[i].Assets, a)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// Newest first within a package.
	byPkg := map[string][]Release{}
	var order []string
	for _, r := range out {
		if _, ok := byPkg[r.Package]; !ok {
			order = append(order, r.Package)
		}
		byPkg[r.Package] = append(byPkg[r.Package], r)
	}
	out = out[:0]
	for _, p := range order {
		rs := byPkg[p]
		vs := make([]string, len(rs))
		m := map[string]Release{}
		for i, r := range rs {
			vs[i] = r.Version
			m[r.Version] = r
		}
		SortVersions(vs)
		for _, v := range vs {
			out = append(out, m[v])
		}
	}
	return out, nil
}
