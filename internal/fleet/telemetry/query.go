package telemetry

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Series is one series as the API and the UI show it.
type Series struct {
	Name      string `json:"name"`
	Component string `json:"component"`
	Unit      string `json:"unit"`
	// Points are [unix seconds, value]: a rate per second for counters
	// (from the bucket before to this one), the value for gauges.
	Points [][2]float64 `json:"points"`
}

// Window is what a query answers.
type Window struct {
	WindowS     float64  `json:"window_s"`
	ResolutionS float64  `json:"resolution_s"`
	Series      []Series `json:"series"`
}

// Reader reads the stored series.
type Reader struct {
	Pool  *pgxpool.Pool
	Tiers Tiers
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

func (r *Reader) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// MaxWindow is the longest window a query accepts: the coarse retention.
func (r *Reader) MaxWindow() time.Duration { return r.Tiers.CoarseRetention }

// CheckWindow refuses a window outside (0, coarse retention].
func (r *Reader) CheckWindow(w time.Duration) error {
	if w <= 0 || w > r.Tiers.CoarseRetention {
		return fmt.Errorf("window %s: must be within (0s, %s] (telemetry.coarseRetention)", w, r.Tiers.CoarseRetention)
	}
	return nil
}

type bucketRow struct {
	bucket int64
	series map[string]float64
}

// Agent returns agent uid's series over the last window, read from the
// finest tier that holds it.
func (r *Reader) Agent(ctx context.Context, uid string, window time.Duration) (Window, error) {
	m, err := r.Agents(ctx, []string{uid}, window)
	if err != nil {
		return Window{}, err
	}
	return m[uid], nil
}

// Agents returns the series of each of uids over the last window.
func (r *Reader) Agents(ctx context.Context, uids []string, window time.Duration) (map[string]Window, error) {
	return r.agents(ctx, uids, window, r.Tiers.For(window))
}

// AgentsCoarse is Agents read from the coarse tier whatever the window:
// a picture of many agents (the agents list's sparklines) reads a sixth
// of the rows at the default resolutions.
func (r *Reader) AgentsCoarse(ctx context.Context, uids []string, window time.Duration) (map[string]Window, error) {
	return r.agents(ctx, uids, window, 1)
}

func (r *Reader) agents(ctx context.Context, uids []string, window time.Duration, tier int) (map[string]Window, error) {
	if err := r.CheckWindow(window); err != nil {
		return nil, err
	}
	res := r.Tiers.res(tier)
	now := r.now()
	// One bucket more than the window: the first rate needs the one before.
	from := r.Tiers.Bucket(tier, now.Add(-window)) - res
	rows, err := r.Pool.Query(ctx, `SELECT instance_uid, bucket, series FROM agent_telemetry
		WHERE instance_uid = ANY($1) AND tier = $2 AND bucket >= $3 ORDER BY instance_uid, bucket`, uids, tier, from)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	byUID := map[string][]bucketRow{}
	for rows.Next() {
		var uid string
		var br bucketRow
		var raw []byte
		if err := rows.Scan(&uid, &br.bucket, &raw); err != nil {
			return nil, err
		}
		if err := json.Unmarshal(raw, &br.series); err != nil {
			return nil, err
		}
		byUID[uid] = append(byUID[uid], br)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make(map[string]Window, len(uids))
	for _, uid := range uids {
		out[uid] = Window{WindowS: window.Seconds(), ResolutionS: float64(res), Series: Rates(byUID[uid], res, from+res)}
	}
	return out, nil
}

// SampledAtKey holds, in a row's series, when its newest values were
// received (unix seconds): a rate is the difference of two rows over the
// time between their samples, which is the buckets' distance only when
// both samples came at the same point of their buckets (not so in the
// bucket still filling, or one the agent stopped sending in). Rows
// written before it existed are read by their buckets' distance.
const SampledAtKey = "@t"

// Rates turns the rows of one agent (ascending buckets, res seconds apart
// at most) into series: counters become the rate from the previous row
// (no point after a gap longer than 3 buckets; a value below the previous
// one is a reset, read from zero), gauges are as stored. Points before
// since are left out.
func Rates(rows []bucketRow, res, since int64) []Series {
	type acc struct {
		s     Series
		kind  Kind
		prev  float64
		at    int64
		prevT float64
		has   bool
	}
	byKey := map[string]*acc{}
	for _, row := range rows {
		t, timed := row.series[SampledAtKey]
		for ks, v := range row.series {
			k, ok := parseKey(ks)
			if !ok {
				continue
			}
			a := byKey[ks]
			if a == nil {
				e := Catalog[k.Name]
				a = &acc{s: Series{Name: k.Name, Component: k.Component, Unit: e.Unit, Points: [][2]float64{}}, kind: e.Kind}
				byKey[ks] = a
			}
			if a.kind == Gauge {
				if row.bucket >= since {
					a.s.Points = append(a.s.Points, [2]float64{float64(row.bucket), v})
				}
				continue
			}
			if a.has && row.bucket-a.at <= 3*res && row.bucket >= since {
				d := v - a.prev
				if d < 0 {
					d = v // the agent restarted: its counter started again from 0
				}
				dt := float64(row.bucket - a.at)
				if timed && a.prevT > 0 && t > a.prevT {
					dt = t - a.prevT
				}
				a.s.Points = append(a.s.Points, [2]float64{float64(row.bucket), d / dt})
			}
			a.prev, a.at, a.has = v, row.bucket, true
			a.prevT = 0
			if timed {
				a.prevT = t
			}
		}
	}
	out := make([]Series, 0, len(byKey))
	for _, a := range byKey {
		out = append(out, a.s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Component < out[j].Component
	})
	return out
}

// Sum adds the series of one class ("throughput", "refused", "failed")
// into one, point by point (points at the same time add up).
func Sum(series []Series, class string) [][2]float64 {
	m := map[float64]float64{}
	for _, s := range series {
		if Catalog[s.Name].Class != class {
			continue
		}
		for _, p := range s.Points {
			m[p[0]] += p[1]
		}
	}
	out := make([][2]float64, 0, len(m))
	for t, v := range m {
		out = append(out, [2]float64{t, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] })
	return out
}

// FleetNames are the series of the fleet view.
var FleetNames = []string{"throughput", "refused", "failed", "agents.online", "agents.offline", "agents.unhealthy", "agents.reporting"}

// Fleet returns the fleet's sums over the last window (coarse buckets,
// computed by the leader's job).
func (r *Reader) Fleet(ctx context.Context, window time.Duration) (Window, error) {
	if err := r.CheckWindow(window); err != nil {
		return Window{}, err
	}
	from := r.Tiers.Bucket(1, r.now().Add(-window))
	rows, err := r.Pool.Query(ctx, `SELECT bucket, name, value FROM fleet_telemetry WHERE bucket >= $1 ORDER BY bucket`, from)
	if err != nil {
		return Window{}, err
	}
	defer rows.Close()
	by := map[string]*Series{}
	for _, n := range FleetNames {
		unit := "items/s"
		if strings.HasPrefix(n, "agents.") {
			unit = "agents"
		}
		by[n] = &Series{Name: n, Component: "fleet", Unit: unit, Points: [][2]float64{}}
	}
	for rows.Next() {
		var b int64
		var n string
		var v float64
		if err := rows.Scan(&b, &n, &v); err != nil {
			return Window{}, err
		}
		if s := by[n]; s != nil {
			s.Points = append(s.Points, [2]float64{float64(b), v})
		}
	}
	if err := rows.Err(); err != nil {
		return Window{}, err
	}
	w := Window{WindowS: window.Seconds(), ResolutionS: float64(r.Tiers.res(1))}
	for _, n := range FleetNames {
		w.Series = append(w.Series, *by[n])
	}
	return w, nil
}
