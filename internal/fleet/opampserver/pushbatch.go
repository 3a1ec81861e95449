package opampserver

import (
	"context"
	"strings"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// pushQueryChunk bounds the agents read by one desired-config query.
const pushQueryChunk = 1000

// PushBatch is the event bus's delivery: payloads are notifications in
// arrival order. Revocations, rotations, package offers and restarts go
// one by one through Push; the plain ones (an agent's desired config
// changed) are read for all agents connected here with one query per
// thousand, which is what lets a rollout wave of thousands of agents reach
// them at the speed of the sockets rather than of one query per agent.
func (s *Server) PushBatch(ctx context.Context, payloads []string) {
	var uids []string
	acs := map[string]*agentConn{}
	for _, p := range payloads {
		if !plainConfigNotification(p) {
			s.Push(ctx, p)
			continue
		}
		if ac := s.markConfigChanged(p); ac != nil {
			if _, dup := acs[p]; !dup {
				uids = append(uids, p)
			}
			acs[p] = ac
		}
	}
	for len(uids) > 0 {
		n := min(len(uids), pushQueryChunk)
		d, err := s.o.Store.DesiredConfigs(ctx, uids[:n])
		if err != nil {
			s.log.Warn("loading desired configs failed; the reconcile will retry", "agents", n, "error", err)
			return
		}
		for _, uid := range uids[:n] {
			if want, ok := d[uid]; ok {
				s.deliver(ctx, acs[uid], want)
			}
		}
		uids = uids[n:]
	}
}

// plainConfigNotification reports whether p is an agent UID alone (its
// desired config changed) rather than a prefixed command.
func plainConfigNotification(p string) bool {
	for _, prefix := range []string{store.RevokeNotifyPrefix, store.RotateNotifyPrefix, PackagesNotifyPrefix, store.RestartNotifyPrefix} {
		if strings.HasPrefix(p, prefix) {
			return false
		}
	}
	return true
}

// markConfigChanged tells a plain-HTTP agent's next poll to look at its
// config, and returns uid's WebSocket connection here, if any.
func (s *Server) markConfigChanged(uid string) *agentConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ha := s.http[uid]; ha != nil {
		ha.mu.Lock()
		ha.dirty = true
		ha.mu.Unlock()
	}
	return s.byUID[uid]
}
