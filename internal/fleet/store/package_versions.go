package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// PackageVersionCount is how many agents report a package version as
// installed (from their OpAMP package statuses).
type PackageVersionCount struct {
	Package string `json:"package"`
	Version string `json:"version"`
	Online  int64  `json:"online"`
	Agents  int64  `json:"agents"`
}

// PackageVersions counts the installed versions per package across the fleet.
func (s *Store) PackageVersions(ctx context.Context) ([]PackageVersionCount, error) {
	rows, err := s.Pool.Query(ctx, `SELECT p.k, coalesce(p.s->>'agent_has_version', ''),
			count(*) FILTER (WHERE a.status = 'online'), count(*)
		FROM agents a, jsonb_each(coalesce(a.package_statuses->'packages', '{}')) AS p(k, s)
		GROUP BY 1, 2 ORDER BY 1, 2`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[PackageVersionCount])
}

// AgentsWithoutPackages counts the agents that report no package status
// (and those of them online): the "not reported" of the versions in use.
func (s *Store) AgentsWithoutPackages(ctx context.Context) (online, total int64, err error) {
	err = s.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'online'), count(*) FROM agents
		WHERE coalesce(package_statuses->'packages', '{}') = '{}'`).Scan(&online, &total)
	return online, total, err
}
