package artifacts

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/myriarch/myriarch/internal/fleet/releases"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// want is one asset the fleet needs and no blob holds yet.
type want struct {
	releases.Asset
	pkg, version, publicKey string
}

// planner chooses what to download: the assets of the newest keep versions
// of every package that match a platform of the fleet.
type planner struct {
	pool *pgxpool.Pool
	keep int
}

// wanted lists the assets of the newest keep versions of every package that
// match a platform of the fleet and have no blob yet, newest first.
func (p planner) wanted(ctx context.Context) ([]want, error) {
	rels, err := releases.ListReleases(ctx, p.pool, "")
	if err != nil {
		return nil, err
	}
	srcs, err := releases.ListSources(ctx, p.pool)
	if err != nil {
		return nil, err
	}
	keys := map[string]string{}
	for _, s := range srcs {
		keys[s.Name] = s.PublicKey
	}
	plat, err := p.platforms(ctx)
	if err != nil {
		return nil, err
	}
	have, err := p.haveBlobs(ctx)
	if err != nil {
		return nil, err
	}
	var out []want
	seen := map[string]bool{}
	n := map[string]int{}
	for _, r := range rels { // newest first within a package
		if n[r.Package] >= p.keep {
			continue
		}
		n[r.Package]++
		for _, a := range r.Assets {
			if have[a.Digest] || seen[a.Digest] {
				continue
			}
			if a.OS != "" && !plat[a.OS+"/"+a.Arch] {
				continue
			}
			seen[a.Digest] = true
			out = append(out, want{Asset: a, pkg: r.Package, version: r.Version, publicKey: keys[r.Package]})
		}
	}
	return out, nil
}

// platforms returns the "os/arch" pairs that the fleet's agents report.
func (p planner) platforms(ctx context.Context) (map[string]bool, error) {
	ps, err := store.AgentPlatforms(ctx, p.pool)
	m := map[string]bool{}
	for _, s := range ps {
		m[s] = true
	}
	return m, err
}

func (p planner) haveBlobs(ctx context.Context) (map[string]bool, error) {
	rows, err := p.pool.Query(ctx, `SELECT digest FROM artifact_blobs`)
	if err != nil {
		return nil, err
	}
	ds, err := pgx.CollectRows(rows, pgx.RowTo[string])
	m := map[string]bool{}
	for _, d := range ds {
		m[d] = true
	}
	return m, err
}
