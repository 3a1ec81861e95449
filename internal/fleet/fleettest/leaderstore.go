package fleettest

import (
	"context"
	"testing"

	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/pgleader"
)

// LeaderStore opens a store (at most conns connections) on a throwaway
// PostgreSQL and elects replica "r1" on it, until the end of the test: the
// set-up of a leader job's tests (rollouts, upgrades). The context ends,
// the elector stops and the store closes at cleanup, in that order.
func LeaderStore(t testing.TB, conns int32) (context.Context, *store.Store, *pgleader.Leadership) {
	t.Helper()
	pg := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	st, err := store.Open(ctx, pg.DSN(""), conns, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	el, stopElector, err := Elect(st.Pool, "r1")
	if err != nil {
		cancel()
		st.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); stopElector(); st.Close() })
	return ctx, st, el
}
