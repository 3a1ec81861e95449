package opampserver

import (
	"context"
	"strings"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// Push and the reconcile
//
// Every replica hears every notification of the event bus; each acts on
// the agents connected to it and ignores the others. A notification is an
// agent UID alone (its desired config changed), or a prefix and one: a
// revocation or rotation (identity, security.go), a package offer
// (packages.go), a restart request (commands.go). The reconcile is the
// safety net for notifications lost while the listener session
// reconnected.

// queryChunk bounds the agents read by one query of a push or the
// reconcile.
const queryChunk = 1000

// Push acts on one notification of the event bus: it delivers the desired
// config, a restart command, a package offer or a credential rotation to
// the agent if it is connected here, or closes a revoked agent's
// connection.
func (s *Server) Push(ctx context.Context, payload string) {
	s.PushBatch(ctx, []string{payload})
}

// PushBatch is the event bus's delivery: payloads are notifications in
// arrival order. Revocations, rotations, package offers and restarts go
// one by one; the plain ones (an agent's desired config changed) are read
// for all agents connected here with one query per thousand, which is
// what lets a rollout wave of thousands of agents reach them at the speed
// of the sockets rather than of one query per agent.
func (s *Server) PushBatch(ctx context.Context, payloads []string) {
	var uids []string
	acs := map[string]*agentConn{}
	for _, p := range payloads {
		if s.pushPrefixed(ctx, p) {
			continue
		}
		// The agent's config changed: a plain-HTTP agent looks on its
		// next poll; a WebSocket agent is sent it below.
		if ac := s.mark(p, func(ha *httpAgent) { ha.dirty = true }); ac != nil {
			if _, dup := acs[p]; !dup {
				uids = append(uids, p)
			}
			acs[p] = ac
		}
	}
	for len(uids) > 0 {
		n := min(len(uids), queryChunk)
		if err := s.configs.deliverTo(ctx, uids[:n], acs); err != nil {
			s.log.Warn("loading desired configs failed; the reconcile will retry", "agents", n, "error", err)
			return
		}
		uids = uids[n:]
	}
}

// pushPrefixed acts on p if it is a prefixed notification, and reports
// whether it was.
func (s *Server) pushPrefixed(ctx context.Context, p string) bool {
	if uid, ok := strings.CutPrefix(p, store.RevokeNotifyPrefix); ok {
		s.revoke(uid)
	} else if uid, ok := strings.CutPrefix(p, store.RotateNotifyPrefix); ok {
		s.rotate(ctx, uid)
	} else if uid, ok := strings.CutPrefix(p, PackagesNotifyPrefix); ok {
		s.pushPackages(ctx, uid)
	} else if uid, ok := strings.CutPrefix(p, store.RestartNotifyPrefix); ok {
		s.cmds.push(ctx, uid)
	} else {
		return false
	}
	return true
}

// Reconcile is the event bus's safety net: it compares the desired config
// of every agent connected here with what the agent reported and was sent,
// and delivers what is missing (a notification that was lost while the
// listener session reconnected), restart requests, credential rotations,
// revocations and package offers included. Plain-HTTP agents look at
// everything on their next poll.
func (s *Server) Reconcile(ctx context.Context) error {
	uids, acs := s.sweep(httpAgentIdle)
	for len(uids) > 0 {
		n := min(len(uids), queryChunk)
		if err := s.configs.deliverTo(ctx, uids[:n], acs); err != nil {
			return err
		}
		if err := s.cmds.reconcile(ctx, uids[:n], acs); err != nil {
			return err
		}
		if err := s.reconcileIdentity(ctx, uids[:n]); err != nil {
			return err
		}
		uids = uids[n:]
	}
	s.reconcilePackages(ctx, acs)
	return nil
}
