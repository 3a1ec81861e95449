package pgleader

import (
	"context"
	"time"
)

// The replica registry: every replica's heartbeat, written through the
// pool.

// Replicas lists the registry; rows whose heartbeat is older than three
// heartbeat intervals are marked Stale.
func (e *Elector) Replicas(ctx context.Context) ([]Replica, error) {
	return ReadReplicas(ctx, e.pool, e.cfg.LockKey, 3*e.cfg.HeartbeatInterval)
}

func (e *Elector) heartbeatLoop(ctx context.Context) {
	e.writeRegistry(ctx, e.IsLeader(), false)
	t := time.NewTicker(e.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			e.writeRegistry(ctx, e.IsLeader(), false)
		}
	}
}

// writeRegistry upserts this replica's row through the pool.
func (e *Elector) writeRegistry(ctx context.Context, leader, final bool) {
	ctx, cancel := context.WithTimeout(ctx, e.k.ConfirmTimeout)
	defer cancel()
	var pid any
	if p := e.lockPID.Load(); p != 0 && !final {
		pid = p
	}
	if _, err := e.pool.Exec(ctx, registryUpsertParam, e.cfg.ID, e.cfg.Host, e.cfg.Version, e.started, leader, pid, e.cfg.LockKey); err != nil && ctx.Err() == nil {
		e.log.Warn("registry heartbeat failed", "error", err)
	}
}
