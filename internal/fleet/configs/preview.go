package configs

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// RevisionContent returns the content of revision rev of configuration
// name; revision 0 is the empty document (what a configuration holds
// before its first revision, so that "diff 0 1" shows the whole first
// revision).
func RevisionContent(ctx context.Context, q store.Querier, name string, rev int) (string, error) {
	if rev < 0 {
		return "", &InvalidError{Err: fmt.Errorf("revision %d: must be a revision number (0 for the empty document)", rev)}
	}
	if rev == 0 {
		if _, err := store.GetConfig(ctx, q, name); err != nil {
			return "", err
		}
		return "", nil
	}
	r, err := store.GetRevision(ctx, q, name, rev)
	if err != nil {
		return "", fmt.Errorf("revision %d: %w", rev, err)
	}
	return r.Content, nil
}

// RevisionDiff is the unified diff of configuration name from revision
// from to revision to (either may be 0, the empty document).
func (s Service) RevisionDiff(ctx context.Context, name string, from, to int) (string, error) {
	x, err := RevisionContent(ctx, s.Store.Pool, name, from)
	if err != nil {
		return "", err
	}
	y, err := RevisionContent(ctx, s.Store.Pool, name, to)
	if err != nil {
		return "", err
	}
	return Diff(fmt.Sprintf("%s revision %d", name, from), fmt.Sprintf("%s revision %d", name, to), x, y), nil
}

// Preview is what a revision would change on the agents that would get
// it (GET /api/v1/configs/{name}/revisions/{rev}/preview): the agents
// assigned to the configuration (narrowed by a selector), grouped by the
// effective config they report now.
type Preview struct {
	Config   string         `json:"config"`
	Revision int            `json:"revision"`
	Hash     string         `json:"hash"`
	Groups   []PreviewGroup `json:"groups"`
}

// PreviewGroup is the agents that run one effective config now
// (EffectiveHash: its store.ConfigHash; "" for agents that report none),
// whether that is the revision already, and the diff from it to the
// revision.
type PreviewGroup struct {
	EffectiveHash string   `json:"effective_hash"`
	Agents        []string `json:"agents"`
	UpToDate      bool     `json:"up_to_date"`
	Diff          string   `json:"diff"`
	// DiffOmitted: the group is past the MaxPreviewDiffs largest ones and
	// carries no diff (its agents and hash are listed).
	DiffOmitted bool `json:"diff_omitted,omitempty"`
}

// MaxPreviewDiffs bounds the groups of a preview that carry a diff, the
// largest that would change first: each diff of two large documents costs up to the
// diff's 16 M cells, and agents that each run their own config (a
// per-agent setting) make one group each; 1,000 of them made one viewer's
// request compute 1,000 diffs and answer hundreds of megabytes.
const MaxPreviewDiffs = 20

// Preview groups the agents assigned to configuration name whose
// attributes also match narrow (nil: all of them) by what they run now,
// against revision rev. The largest group comes first.
func (s Service) Preview(ctx context.Context, name string, rev int, narrow map[string]string) (Preview, error) {
	q := s.Store.Pool
	c, err := store.GetConfig(ctx, q, name)
	if err != nil {
		return Preview{}, err
	}
	r, err := store.GetRevision(ctx, q, name, rev)
	if err != nil {
		return Preview{}, fmt.Errorf("revision %d: %w", rev, err)
	}
	sel := maps.Clone(c.Selector)
	if sel == nil {
		sel = map[string]string{}
	}
	maps.Copy(sel, narrow)
	uids, err := store.AgentsAssigned(ctx, q, sel, name)
	if err != nil {
		return Preview{}, err
	}
	p := Preview{Config: name, Revision: rev, Hash: r.Hash, Groups: []PreviewGroup{}}
	if len(uids) == 0 {
		return p, nil
	}
	running, err := store.EffectiveConfigs(ctx, q, uids)
	if err != nil {
		return Preview{}, err
	}
	groups := map[string]*PreviewGroup{}
	bodies := map[string]string{} // by effective hash
	for _, uid := range uids {
		body := running[uid]
		h := ""
		if body != "" {
			h = store.ConfigHash(body)
		}
		g, ok := groups[h]
		if !ok {
			g = &PreviewGroup{EffectiveHash: h, UpToDate: h == r.Hash}
			groups[h] = g
			bodies[h] = body
		}
		g.Agents = append(g.Agents, uid)
	}
	for _, g := range groups {
		p.Groups = append(p.Groups, *g)
	}
	slices.SortFunc(p.Groups, func(a, b PreviewGroup) int {
		return cmp.Or(cmp.Compare(len(b.Agents), len(a.Agents)), cmp.Compare(a.EffectiveHash, b.EffectiveHash))
	})
	diffs := 0
	for i := range p.Groups {
		g := &p.Groups[i]
		if g.UpToDate {
			continue
		}
		if diffs == MaxPreviewDiffs {
			g.DiffOmitted = true
			continue
		}
		diffs++
		// The request's deadline stops the work, not only the answer.
		if err := ctx.Err(); err != nil {
			return Preview{}, err
		}
		label := "running (no effective config reported)"
		if h := g.EffectiveHash; h != "" {
			label = "running " + h[:min(12, len(h))]
		}
		g.Diff = Diff(label, fmt.Sprintf("%s revision %d", name, rev), bodies[g.EffectiveHash], r.Content)
	}
	return p, nil
}
