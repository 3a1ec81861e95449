package pgleader

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/myriarch/myriarch/internal/pgtest"
)

// offsetClock is the system clock moved forward by off.
type offsetClock struct{ off atomic.Int64 }

func (c *offsetClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// A replica whose clock shows that T/2 passed since the last answered
// confirmation (a process that was paused and wakes up) no longer sees
// itself as leader and its jobs cannot write, at once: neither waits for
// the lead loop or a timer.
func TestPausedReplicaStopsActingAtOnce(t *testing.T) {
	c := pgtest.New(t)
	pool := newPool(t, c.DSN(""))
	clock := &offsetClock{}
	a := startReplica(t, pool, "a", func(cfg *Config) { cfg.Clock = clock })
	a.waitLeads(t, "a leads", 20*time.Second)
	l := a.lead.Load()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	noop := func(context.Context, pgx.Tx) error { return nil }
	if err := l.InTerm(ctx, noop); err != nil {
		t.Fatalf("InTerm while leading: %v", err)
	}
	clock.off.Store(int64(a.e.Keepalive().ResignAfter))
	if a.e.IsLeader() {
		t.Error("IsLeader after T/2 without an answer by the replica's clock")
	}
	if err := l.InTerm(ctx, noop); !errors.Is(err, ErrStaleTerm) {
		t.Errorf("InTerm after T/2 without an answer: %v", err)
	}
}
