package store

import (
	"context"
	"fmt"
)

// ConfigInUse counts the agents whose desired configuration is one
// revision of a configuration (Label "name rN"), or a direct push
// ("direct"), or none ("none").
type ConfigInUse struct {
	Label  string `json:"label"`
	Agents int64  `json:"agents"`
}

// ConfigsInUse counts the agents per desired configuration and revision,
// most used first (the UI overview).
func (s *Store) ConfigsInUse(ctx context.Context) ([]ConfigInUse, error) {
	rows, err := s.Pool.Query(ctx, `SELECT desired_source, desired_config_name, desired_revision, count(*) FROM agents
		GROUP BY 1, 2, 3 ORDER BY 4 DESC LIMIT 50`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ConfigInUse
	for rows.Next() {
		var src, name string
		var rev int
		var n int64
		if err := rows.Scan(&src, &name, &rev, &n); err != nil {
			return nil, err
		}
		label := "none"
		switch src {
		case "revision":
			label = fmt.Sprintf("%s r%d", name, rev)
		case "direct":
			label = "direct push"
		}
		out = append(out, ConfigInUse{Label: label, Agents: n})
	}
	return out, rows.Err()
}
