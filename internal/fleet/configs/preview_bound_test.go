package configs_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// A preview computes at most MaxPreviewDiffs diffs, for the largest
// groups: agents that each run their own config made one viewer's request
// compute a diff per agent.
func TestPreviewBoundsItsDiffs(t *testing.T) {
	pg := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := store.Open(ctx, pg.DSN(""), 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cs := configs.Service{Store: s}
	if _, err := cs.Put(ctx, store.ConfigDef{Name: "edge", Type: configs.TypeYAML, Selector: map[string]string{"role": "edge"}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cs.AddRevision(ctx, "edge", "level: 2\n", "t", ""); err != nil {
		t.Fatal(err)
	}
	// Two agents share a config (the largest group); the others each run
	// their own.
	n := configs.MaxPreviewDiffs + 5
	for i := range n {
		uid := fmt.Sprintf("a%03d", i)
		body := fmt.Sprintf("level: %d\n", 100+i)
		if i < 2 {
			body = "level: 1\n"
		}
		if i == 2 {
			body = "level: 2\n" // up to date: no diff, not counted
		}
		if _, err := s.Connected(ctx, uid, "r1", "c", time.Now()); err != nil {
			t.Fatal(err)
		}
		if err := s.UpdateState(ctx, uid, "c", store.State{NonIdentifying: map[string]string{"role": "edge"}, EffectiveConfig: &body}); err != nil {
			t.Fatal(err)
		}
	}
	p, err := cs.Preview(ctx, "edge", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Groups) != n-1 || len(p.Groups[0].Agents) != 2 || !strings.Contains(p.Groups[0].Diff, "-level: 1\n+level: 2\n") {
		t.Fatalf("groups: %d, first %+v", len(p.Groups), p.Groups[0])
	}
	withDiff := 0
	for i, g := range p.Groups {
		switch {
		case g.Diff != "" && !g.DiffOmitted:
			withDiff++
		case g.UpToDate && g.Diff == "" && !g.DiffOmitted:
		case g.Diff == "" && g.DiffOmitted && i >= configs.MaxPreviewDiffs:
		default:
			t.Errorf("group %d: diff %q, omitted %v", i, g.Diff, g.DiffOmitted)
		}
	}
	if withDiff != configs.MaxPreviewDiffs {
		t.Errorf("%d groups with a diff, want %d", withDiff, configs.MaxPreviewDiffs)
	}
}
