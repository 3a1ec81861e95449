package telemetry

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TableCounters are PostgreSQL's cumulative counters of agent_telemetry
// and its size on disk (heap, TOAST and indexes), for measurements
// (myriarch-loadagents telemetry).
type TableCounters struct {
	Inserts, Updates float64
	Bytes            int64
}

// ReadTableCounters reads them (zero before the table's first write).
func ReadTableCounters(ctx context.Context, pool *pgxpool.Pool) (TableCounters, error) {
	var c TableCounters
	err := pool.QueryRow(ctx, `SELECT coalesce(n_tup_ins, 0)::float8, coalesce(n_tup_upd, 0)::float8, pg_total_relation_size('agent_telemetry')
		FROM pg_stat_user_tables WHERE relname = 'agent_telemetry'`).Scan(&c.Inserts, &c.Updates, &c.Bytes)
	return c, err
}

// TierRows is what one tier holds: its live rows and their mean size
// (pg_column_size of a row: the tuple's data, without the page's and
// the indexes' share).
type TierRows struct {
	Tier     int
	Rows     int64
	RowBytes float64
}

// ReadTierRows counts the rows of each tier (a scan of the table).
func ReadTierRows(ctx context.Context, pool *pgxpool.Pool) ([]TierRows, error) {
	rows, err := pool.Query(ctx, `SELECT tier, count(*), avg(pg_column_size(t.*))::float8 FROM agent_telemetry t GROUP BY tier ORDER BY tier`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []TierRows
	for rows.Next() {
		var t TierRows
		if err := rows.Scan(&t.Tier, &t.Rows, &t.RowBytes); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}
