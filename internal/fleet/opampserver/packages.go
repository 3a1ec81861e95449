package opampserver

import (
	"context"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// PackagesNotifyPrefix prefixes the instance uid in an event bus
// notification that asks for the delivery of the agent's package offers.
const PackagesNotifyPrefix = "packages:"

// EventPackagesSent is the agent event of an offer that went out.
const EventPackagesSent = "packages_sent"

// PendingPackages is the PackagesAvailable message for one agent and the
// connection it was last sent on.
type PendingPackages struct {
	Msg      *protobufs.PackagesAvailable
	SentConn string
	// Detail describes the offer for the agent event.
	Detail string
}

// Packages is where the server finds package offers (package artifacts).
type Packages interface {
	// Pending returns the offers of the agents uids that exist.
	Pending(ctx context.Context, uids []string) (map[string]PendingPackages, error)
	// Sent records that uid's offers went out on connection connID.
	Sent(ctx context.Context, uid, connID string) error
}

// packagesFor returns the offer of uid for a response on connection connID,
// or nil when there is none or it went out on this connection already.
// The caller holds ac.mu.
func (s *Server) packagesFor(ctx context.Context, ac *agentConn, uid string) *protobufs.PackagesAvailable {
	if s.o.Packages == nil {
		return nil
	}
	p, err := s.o.Packages.Pending(ctx, []string{uid})
	if err != nil {
		s.log.Warn("loading package offers failed; the reconcile will retry", "agent", uid, "error", err)
		return nil
	}
	want, ok := p[uid]
	if !ok || want.SentConn == ac.connID {
		return nil
	}
	if err := s.o.Packages.Sent(ctx, uid, ac.connID); err != nil {
		s.log.Warn("recording a package offer failed; the reconcile will retry", "agent", uid, "error", err)
		return nil
	}
	s.o.Batcher.Event(store.Event{InstanceUID: uid, At: time.Now(), Kind: EventPackagesSent, ReplicaID: s.o.ReplicaID, Detail: want.Detail})
	return want.Msg
}

// pushPackages sends uid's package offers if it is connected here over
// WebSocket; a plain-HTTP agent that polled here gets them in the response
// to its next poll (httpPackages).
func (s *Server) pushPackages(ctx context.Context, uid string) {
	s.mu.Lock()
	ac := s.byUID[uid]
	if ha := s.http[uid]; ha != nil {
		ha.mu.Lock()
		ha.pkgCheck = true
		ha.mu.Unlock()
	}
	s.mu.Unlock()
	if ac != nil {
		s.sendPackages(ctx, ac)
	}
}

// httpPackages is the offer for the response to a plain-HTTP agent's poll,
// or nil. It looks only when something may have changed: the agent's first
// poll here, a notification (pushPackages) or the reconcile, so a poll
// costs no query of its own. Plain-HTTP agents share the connection id
// HTTPConnID, so an offer goes out once, by whichever replica the agent
// polls, until it is replaced. A response lost on its way is not resent
// (the agent cannot be told apart from one that received it); offering
// again does. The caller holds ha.mu.
func (s *Server) httpPackages(ctx context.Context, uid string, ha *httpAgent) *protobufs.PackagesAvailable {
	if s.o.Packages == nil || !ha.pkgCheck {
		return nil
	}
	p, err := s.o.Packages.Pending(ctx, []string{uid})
	if err != nil {
		s.log.Warn("loading package offers failed; the next poll retries", "agent", uid, "error", err)
		return nil
	}
	want, ok := p[uid]
	if !ok || want.SentConn == HTTPConnID {
		ha.pkgCheck = false
		return nil
	}
	if err := s.o.Packages.Sent(ctx, uid, HTTPConnID); err != nil {
		s.log.Warn("recording a package offer failed; the next poll retries", "agent", uid, "error", err)
		return nil
	}
	ha.pkgCheck = false
	s.o.Batcher.Event(store.Event{InstanceUID: uid, At: time.Now(), Kind: EventPackagesSent, ReplicaID: s.o.ReplicaID, Detail: want.Detail + " (plain HTTP)"})
	return want.Msg
}

func (s *Server) sendPackages(ctx context.Context, ac *agentConn) {
	ac.mu.Lock()
	defer ac.mu.Unlock()
	pa := s.packagesFor(ctx, ac, ac.uid)
	if pa == nil {
		return
	}
	msg := &protobufs.ServerToAgent{PackagesAvailable: pa}
	msg.InstanceUid, _ = ParseUID(ac.uid)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := ac.conn.Send(sctx, msg); err != nil {
		s.log.Warn("sending package offers failed", "agent", ac.uid, "error", err)
		// Not sent after all: the reconcile tries again.
		_ = s.o.Packages.Sent(ctx, ac.uid, "")
	}
}

// reconcilePackages delivers offers that did not go out on the agents'
// current connections (a lost notification). The offers are read for many
// agents per query; only the agents with an offer that their connection
// has not had are sent anything.
func (s *Server) reconcilePackages(ctx context.Context, acs map[string]*agentConn) {
	if s.o.Packages == nil {
		return
	}
	uids := make([]string, 0, len(acs))
	for uid := range acs {
		uids = append(uids, uid)
	}
	for len(uids) > 0 {
		n := min(len(uids), 1000)
		p, err := s.o.Packages.Pending(ctx, uids[:n])
		if err != nil {
			s.log.Warn("loading package offers failed; the next reconcile retries", "error", err)
			return
		}
		for uid, want := range p {
			if ac := acs[uid]; ac != nil && want.SentConn != ac.connID {
				s.sendPackages(ctx, ac)
			}
		}
		uids = uids[n:]
	}
}
