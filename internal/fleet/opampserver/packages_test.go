package opampserver

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"

	"github.com/myriarch/myriarch/internal/fleet/lastseen"
)

// memPackages is one agent's offer held in memory, with the bookkeeping of
// artifacts.OfferSource (whose SQL offers_test.go in artifacts checks),
// minus the time floor of Resend: these tests are about the polls.
type memPackages struct {
	mu      sync.Mutex
	offer   *protobufs.PackagesAvailable
	sent    string
	acked   bool
	lookups int
	sends   int
}

func (m *memPackages) Pending(_ context.Context, uids []string) (map[string]PendingPackages, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lookups++
	out := map[string]PendingPackages{}
	if m.offer != nil {
		// Acked as OfferSource computes it: only an offer that went out.
		out[uids[0]] = PendingPackages{Msg: m.offer, SentConn: m.sent, Acked: m.acked && m.sent != "", Detail: "otelcol v1"}
	}
	return out, nil
}

func (m *memPackages) Sent(_ context.Context, _, connID string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sent = connID
	m.sends++
	return nil
}

func (m *memPackages) Resend(_ context.Context, _, connID string, _ time.Duration) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sent != connID {
		return false, nil
	}
	m.sends++
	return true, nil
}

// reoffer records the offer again, not sent (artifacts.OfferTx).
func (m *memPackages) reoffer() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sent = ""
}

var testOffer = &protobufs.PackagesAvailable{
	Packages:        map[string]*protobufs.PackageAvailable{"otelcol": {Version: "v1", Hash: []byte{1, 2, 3}}, "extra": {Version: "v2", Hash: []byte{4, 5}}},
	AllPackagesHash: []byte{9, 9, 9},
}

const pkgUID = "0190a1b2-0000-4000-8000-0000000000e1"

func pkgServer(t *testing.T, m *memPackages) *Server {
	t.Helper()
	return New(Options{Batcher: lastseen.New(nil, time.Minute, nil, nil), Packages: m, ReplicaID: "r1"})
}

// poll is one plain-HTTP poll carrying ps; it reports whether the response
// carries the offer.
func poll(s *Server, ha *httpAgent, ps *protobufs.PackageStatuses) bool {
	return s.httpPackages(context.Background(), pkgUID, ha, &protobufs.AgentToServer{PackageStatuses: ps}) != nil
}

func newHTTPAgent(caps protobufs.AgentCapabilities) *httpAgent {
	ha := &httpAgent{pkgCheck: true}
	ha.rep.caps = uint64(caps)
	return ha
}

const reportsStatuses = protobufs.AgentCapabilities_AgentCapabilities_ReportsPackageStatuses

// An offer not acknowledged is sent again after PackageResendPolls polls,
// then after twice as many, and so on up to PackageResendMaxPolls; the
// reconcile (or a notification) in between looks the offer up but does not
// shorten the wait.
func TestHTTPPackagesResendsWithABackOffThatTheReconcileDoesNotShorten(t *testing.T) {
	m := &memPackages{offer: testOffer}
	s := pkgServer(t, m)
	ha := newHTTPAgent(reportsStatuses)
	if !poll(s, ha, nil) || m.sent != HTTPConnID || m.sends != 1 {
		t.Fatalf("first poll: sent on %q, %d sends", m.sent, m.sends)
	}
	// The reconcile marks the agent between polls: the offer is looked up
	// but not sent before PackageResendPolls polls.
	for i := 1; i < PackageResendPolls; i++ {
		ha.pkgCheck = true
		if poll(s, ha, nil) {
			t.Fatalf("poll %d after the send, after a reconcile: sent again", i)
		}
	}
	var gaps []int
	n := 0
	for len(gaps) < 7 && n < 1000 {
		n++
		if poll(s, ha, nil) {
			gaps = append(gaps, n)
			n = 0
		}
	}
	want := []int{1, 6, 12, 24, PackageResendMaxPolls, PackageResendMaxPolls, PackageResendMaxPolls}
	for i := range want {
		if i >= len(gaps) || gaps[i] != want[i] {
			t.Fatalf("polls between re-sends %v, want %v", gaps, want)
		}
	}
	if m.sends != 1+len(want) {
		t.Fatalf("%d sends recorded, want %d", m.sends, 1+len(want))
	}
}

// An agent that names the offer's AllPackagesHash (before it reaches
// every package), or every offered hash, acknowledged it: no more
// look-ups, no re-send.
func TestHTTPPackagesStopsOnceTheAgentAcknowledges(t *testing.T) {
	for name, ps := range map[string]*protobufs.PackageStatuses{
		"all packages hash": {ServerProvidedAllPackagesHash: testOffer.AllPackagesHash},
		"every package": {Packages: map[string]*protobufs.PackageStatus{
			"otelcol": {ServerOfferedHash: []byte{1, 2, 3}, Status: protobufs.PackageStatusEnum_PackageStatusEnum_Installing},
			"extra":   {AgentHasHash: []byte{4, 5}, Status: protobufs.PackageStatusEnum_PackageStatusEnum_Installed}}},
	} {
		t.Run(name, func(t *testing.T) {
			m := &memPackages{offer: testOffer}
			s := pkgServer(t, m)
			ha := newHTTPAgent(reportsStatuses)
			if !poll(s, ha, nil) {
				t.Fatal("not sent")
			}
			if poll(s, ha, ps) {
				t.Fatal("sent again on the acknowledging poll")
			}
			lookups := m.lookups
			for i := range 10 * PackageResendPolls {
				if poll(s, ha, nil) {
					t.Fatalf("poll %d after the acknowledgement: sent again", i)
				}
			}
			if m.lookups != lookups || m.sends != 1 {
				t.Fatalf("%d look-ups and %d sends after the acknowledgement", m.lookups-lookups, m.sends)
			}
		})
	}
	// Only one package named: not acknowledged, sent again.
	m := &memPackages{offer: testOffer}
	s := pkgServer(t, m)
	ha := newHTTPAgent(reportsStatuses)
	poll(s, ha, nil)
	part := &protobufs.PackageStatuses{Packages: map[string]*protobufs.PackageStatus{"otelcol": {ServerOfferedHash: []byte{1, 2, 3}}},
		ServerProvidedAllPackagesHash: []byte{1}}
	resent := false
	for range PackageResendPolls {
		resent = poll(s, ha, part) || resent
	}
	if !resent {
		t.Fatal("an offer acknowledged for one package of two was not sent again")
	}
}

// The stored status stops re-sends only: the same hash offered again (a
// new offer, not sent yet) after a failed install is sent, and once sent,
// the stored status that names its hash stops the re-sends.
func TestHTTPPackagesSendsAnOfferMadeAgainWhateverTheAgentReported(t *testing.T) {
	m := &memPackages{offer: testOffer, acked: true}
	s := pkgServer(t, m)
	ha := newHTTPAgent(reportsStatuses)
	if !poll(s, ha, nil) {
		t.Fatal("a new offer whose hash the stored status names was not sent")
	}
	m.reoffer()
	ha.pkgCheck = true // the notification of the new offer
	if !poll(s, ha, nil) || m.sends != 2 {
		t.Fatalf("the offer made again was not sent: %d sends", m.sends)
	}
	for i := range 10 * PackageResendPolls {
		if poll(s, ha, nil) {
			t.Fatalf("poll %d: sent again though the stored status acknowledges it", i)
		}
	}
}

// An agent that does not report package statuses cannot acknowledge: it
// gets each offer once.
func TestHTTPPackagesSendsOnceToAnAgentThatReportsNoStatuses(t *testing.T) {
	m := &memPackages{offer: testOffer}
	s := pkgServer(t, m)
	ha := newHTTPAgent(0)
	if !poll(s, ha, nil) {
		t.Fatal("not sent")
	}
	for i := range 10 * PackageResendPolls {
		ha.pkgCheck = i%3 == 0 // reconciles
		if poll(s, ha, nil) {
			t.Fatalf("poll %d: sent again", i)
		}
	}
}
