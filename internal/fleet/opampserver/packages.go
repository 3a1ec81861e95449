package opampserver

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"
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
	// Acked is set when the offer went out (SentConn is set) and the
	// package statuses that the agent last reported (as stored) name the
	// hash of every offered package, as offered (installing, failed) or as
	// the one it has (installed), or name the offer's AllPackagesHash: the
	// agent got the offer. It stops re-sends only; an offer not sent yet is
	// sent whatever the agent reported before.
	Acked bool
	// Detail describes the offer for the agent event.
	Detail string
}

// Packages is where the server finds package offers (package artifacts).
type Packages interface {
	// Pending returns the offers of the agents uids that exist.
	Pending(ctx context.Context, uids []string) (map[string]PendingPackages, error)
	// Sent records that uid's offers went out on connection connID.
	Sent(ctx context.Context, uid, connID string) error
	// Resend records that uid's offers go out on connID again, if they
	// went out there last at least after ago; it returns false (and
	// records nothing) when they did not: another replica sent them again
	// meanwhile, or the last send is too recent.
	Resend(ctx context.Context, uid, connID string, after time.Duration) (bool, error)
}

// Re-sending an offer to a plain-HTTP agent. A poll response that carried
// an offer and was lost on its way cannot be told apart from one that
// arrived, except by what the agent reports next: an agent that got the
// offer reports a PackageStatus naming the offered hash (installing,
// installed or failed), or the offer's AllPackagesHash as
// ServerProvidedAllPackagesHash, in its next message. Until it does, the
// offer is sent again, less and less often.
const (
	// PackageResendPolls is how many polls of a plain-HTTP agent (on the
	// replica it polls) without a status for the offered hash pass before
	// the offer is looked up again and re-sent. Each time the replica finds
	// the offer still unacknowledged after its wait, the wait doubles, up to
	// PackageResendMaxPolls.
	PackageResendPolls = 3
	// PackageResendMaxPolls is the longest wait between two re-sends of an
	// offer by one replica, in polls of the agent.
	PackageResendMaxPolls = 48
	// PackageResendAfter is the least time between two sends of an offer
	// to a plain-HTTP agent, whichever replicas send it.
	PackageResendAfter = 5 * time.Second
)

// pkgWait is the offer a plain-HTTP agent was sent (by this replica or
// another) and has not acknowledged yet, as this replica follows it.
type pkgWait struct {
	// hashes maps each offered package to its hash, all is the offer's
	// AllPackagesHash; hashes is nil when nothing is awaited.
	hashes map[string][]byte
	all    []byte
	// polls counts the agent's polls here since the offer was sent or
	// last found unacknowledged; waits how many times this replica found
	// it unacknowledged after a full wait.
	polls, waits int
}

// due is the number of polls to wait before looking again: PackageResendPolls,
// doubled for every earlier wait, at most PackageResendMaxPolls.
func (w *pkgWait) due() int {
	n := PackageResendPolls
	for range w.waits {
		if n *= 2; n >= PackageResendMaxPolls {
			return PackageResendMaxPolls
		}
	}
	return n
}

// offerer delivers the package offers of the agents served here.
type offerer struct {
	// pkgs is the source of offers; nil offers nothing.
	pkgs Packages
	ev   events
	log  *slog.Logger
	reg  *registry
}

// packagesFor returns the offer of uid for a response on connection connID,
// or nil when there is none or it went out on this connection already.
// The caller holds ac.mu.
func (o *offerer) packagesFor(ctx context.Context, ac *agentConn, uid string) *protobufs.PackagesAvailable {
	if o.pkgs == nil {
		return nil
	}
	p, err := o.pkgs.Pending(ctx, []string{uid})
	if err != nil {
		o.log.Warn("loading package offers failed; the reconcile will retry", "agent", uid, "error", err)
		return nil
	}
	want, ok := p[uid]
	if !ok || want.SentConn == ac.connID {
		return nil
	}
	if err := o.pkgs.Sent(ctx, uid, ac.connID); err != nil {
		o.log.Warn("recording a package offer failed; the reconcile will retry", "agent", uid, "error", err)
		return nil
	}
	o.ev.add(uid, time.Now(), EventPackagesSent, want.Detail)
	return want.Msg
}

// pushPackages sends uid's package offers if it is connected here over
// WebSocket; a plain-HTTP agent that polled here gets them in the response
// to its next poll (httpPackages).
func (o *offerer) pushPackages(ctx context.Context, uid string) {
	if ac := o.reg.mark(uid, func(ha *httpAgent) { ha.pkgCheck = true }); ac != nil {
		o.sendPackages(ctx, ac)
	}
}

// httpPackages is the offer for the response to a plain-HTTP agent's poll,
// or nil. It looks only when something may have changed: the agent's first
// poll here, a notification (pushPackages), the reconcile, or an offer
// sent to the agent that it has not acknowledged for the wait (pkgWait.due
// polls). So a poll costs no query of its own while no offer is
// outstanding; while one is, a query per wait.
//
// Plain-HTTP agents share the connection id HTTPConnID, so an offer goes
// out once, by whichever replica the agent polls, and again only while the
// agent reports no status for the offered hash: a response lost on its way
// is sent again, after PackageResendPolls polls, then after twice as many,
// and so on up to PackageResendMaxPolls (a notification or the reconcile
// does not shorten the wait); an agent that reported a status for the
// hash, or the offer's AllPackagesHash, is not sent it again. A new offer
// (one not sent yet) is sent whatever the agent last reported: the same
// hash offered again after a failed install is a new offer. An agent that
// does not declare ReportsPackageStatuses cannot acknowledge, so it gets
// each offer once. The caller holds ha.mu.
func (o *offerer) httpPackages(ctx context.Context, uid string, ha *httpAgent, msg *protobufs.AgentToServer) *protobufs.PackagesAvailable {
	if o.pkgs == nil {
		return nil
	}
	w := &ha.pkgWait
	if w.hashes != nil {
		if acknowledges(msg.PackageStatuses, w.hashes, w.all) {
			*w = pkgWait{}
		} else if w.polls++; w.polls >= w.due() {
			ha.pkgCheck = true
		}
	}
	if !ha.pkgCheck {
		return nil
	}
	ha.pkgCheck = false
	p, err := o.pkgs.Pending(ctx, []string{uid})
	if err != nil {
		ha.pkgCheck = true
		o.log.Warn("loading package offers failed; the next poll retries", "agent", uid, "error", err)
		return nil
	}
	want, ok := p[uid]
	// The stored status says only whether an offer that went out arrived:
	// it may name the same hash for an earlier offer (a failed install).
	if !ok || want.Acked && want.SentConn != "" {
		*w = pkgWait{}
		return nil
	}
	wait := pkgWait{hashes: offeredHashes(want.Msg), all: want.Msg.GetAllPackagesHash()}
	if ha.rep.caps&uint64(protobufs.AgentCapabilities_AgentCapabilities_ReportsPackageStatuses) == 0 {
		wait = pkgWait{}
	}
	detail := want.Detail + " (plain HTTP)"
	if want.SentConn == HTTPConnID {
		// Sent before, by this replica or another, and not acknowledged.
		// Wait from when this replica first sees the offer
		// unacknowledged, then send it again.
		if wait.hashes == nil || w.hashes == nil || !maps.EqualFunc(wait.hashes, w.hashes, bytes.Equal) {
			*w = wait
			return nil
		}
		if w.polls < w.due() {
			// Looked up early (a notification, the reconcile).
			return nil
		}
		again, err := o.pkgs.Resend(ctx, uid, HTTPConnID, PackageResendAfter)
		if err != nil {
			ha.pkgCheck = true
			o.log.Warn("recording a package offer failed; the next poll retries", "agent", uid, "error", err)
			return nil
		}
		// Sent again, here or (too recently) by another replica: wait
		// longer before the next time.
		w.polls, w.waits = 0, w.waits+1
		if !again {
			return nil
		}
		detail += ", sent again: no status for it"
	} else if err := o.pkgs.Sent(ctx, uid, HTTPConnID); err != nil {
		ha.pkgCheck = true
		o.log.Warn("recording a package offer failed; the next poll retries", "agent", uid, "error", err)
		return nil
	} else {
		*w = wait
	}
	o.ev.add(uid, time.Now(), EventPackagesSent, detail)
	return want.Msg
}

// offeredHashes maps each package of pa to its offered hash.
func offeredHashes(pa *protobufs.PackagesAvailable) map[string][]byte {
	m := make(map[string][]byte, len(pa.GetPackages()))
	for name, p := range pa.GetPackages() {
		m[name] = p.GetHash()
	}
	return m
}

// acknowledges reports whether ps shows that the agent got the offer: it
// names the offer's AllPackagesHash as the one the server provided (opamp-go
// sets it when it starts to sync an offer, before it reaches every package),
// or, for every package of hashes, its hash as offered or as the one the
// agent has.
func acknowledges(ps *protobufs.PackageStatuses, hashes map[string][]byte, all []byte) bool {
	if ps == nil {
		return false
	}
	if len(all) > 0 && bytes.Equal(ps.GetServerProvidedAllPackagesHash(), all) {
		return true
	}
	for name, h := range hashes {
		st := ps.GetPackages()[name]
		if st == nil || !bytes.Equal(st.GetServerOfferedHash(), h) && !bytes.Equal(st.GetAgentHasHash(), h) {
			return false
		}
	}
	return true
}

// sendPackages sends ac's offer if its connection has not had it.
func (o *offerer) sendPackages(ctx context.Context, ac *agentConn) {
	ac.mu.Lock()
	defer ac.mu.Unlock()
	pa := o.packagesFor(ctx, ac, ac.uid)
	if pa == nil {
		return
	}
	if err := ac.send(ctx, &protobufs.ServerToAgent{PackagesAvailable: pa}); err != nil {
		o.log.Warn("sending package offers failed", "agent", ac.uid, "error", err)
		// Not sent after all: the reconcile tries again.
		_ = o.pkgs.Sent(ctx, ac.uid, "")
	}
}

// reconcilePackages delivers offers that did not go out on the agents'
// current connections (a lost notification). The offers are read for many
// agents per query; only the agents with an offer that their connection
// has not had are sent anything.
func (o *offerer) reconcilePackages(ctx context.Context, acs map[string]*agentConn) {
	if o.pkgs == nil {
		return
	}
	uids := make([]string, 0, len(acs))
	for uid := range acs {
		uids = append(uids, uid)
	}
	for len(uids) > 0 {
		n := min(len(uids), queryChunk)
		p, err := o.pkgs.Pending(ctx, uids[:n])
		if err != nil {
			o.log.Warn("loading package offers failed; the next reconcile retries", "error", err)
			return
		}
		for uid, want := range p {
			if ac := acs[uid]; ac != nil && want.SentConn != ac.connID {
				o.sendPackages(ctx, ac)
			}
		}
		uids = uids[n:]
	}
}
