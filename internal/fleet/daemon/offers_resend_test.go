package daemon

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/open-telemetry/opamp-go/protobufs"
	"google.golang.org/protobuf/proto"

	"github.com/myriarch/myriarch/internal/fleet/artifacts"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/opampserver"
)

// offerDropper forwards plain-HTTP OpAMP polls to a replica and loses the
// first response that carries a package offer on its way back: the replica
// sent it, the agent never sees it (the connection is closed instead).
// After that it forwards to the other replica (a load balancer may). It
// counts the polls and the offers that it let through.
type offerDropper struct {
	target, after string
	dropped       atomic.Bool
	polls         atomic.Int64
	offers        atomic.Int64
}

func (d *offerDropper) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.polls.Add(1)
	target := d.target
	if d.dropped.Load() {
		target = d.after
	}
	forwardPoll(w, r, target, func() bool {
		if d.dropped.CompareAndSwap(false, true) {
			return true
		}
		d.offers.Add(1)
		return false
	})
}

// forwardPoll forwards one plain-HTTP OpAMP poll to target and writes the
// reply back; when the reply carries a package offer it asks offer, and
// closes the connection instead of replying if offer returns true (the
// reply is lost on the way).
func forwardPoll(w http.ResponseWriter, r *http.Request, target string, offer func() (lose bool)) {
	body, _ := io.ReadAll(r.Body)
	req, _ := http.NewRequestWithContext(r.Context(), r.Method, target+r.URL.Path, bytes.NewReader(body))
	req.Header = r.Header.Clone()
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	plain := out
	if resp.Header.Get("Content-Encoding") == "gzip" {
		if zr, err := gzip.NewReader(bytes.NewReader(out)); err == nil {
			plain, _ = io.ReadAll(zr)
		}
	}
	var msg protobufs.ServerToAgent
	if proto.Unmarshal(plain, &msg) == nil && msg.PackagesAvailable != nil && offer() {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(out)
}

// A poll response that carries an offer to a plain-HTTP agent and is lost
// on the way is sent again (the agent reports no status for the offered
// hash) by the replica the agent polls next, which is not the one that sent
// it; so the agent still gets the offer, downloads it and reports it
// installed. Once it reported a status for the hash it is not sent the
// offer again.
func TestLostOfferToPlainHTTPAgentIsSentAgainUntilAcknowledged(t *testing.T) {
	e := startSoftwareEnv(t, nil)
	// replica-b's offers point at a proxy that corrupts downloads
	// (startSoftwareEnv): the re-send must be replica-a's for the install
	// to succeed.
	drop := &offerDropper{target: "http://" + e.b.OpAMPAddr().String(), after: "http://" + e.a.OpAMPAddr().String()}
	srv := httptest.NewServer(drop)
	t.Cleanup(srv.Close)

	ps := newPkgStore(e.pub)
	var offers offerLog
	uid := startOfferAgent(t, offerAgent{url: srv.URL + "/v1/opamp"}, ps, &offers)
	v1 := e.release(t, "v1.0.0")
	waitAcceptsPackages(t, e.ca, uid)
	// The agent polls replica-b until the loss, then replica-a.
	offerAndWait(t, e.ca, uid, "v1.0.0")
	if !drop.dropped.Load() || drop.offers.Load() < 1 {
		t.Fatalf("dropped %v, offers let through %d: the test did not lose an offer", drop.dropped.Load(), drop.offers.Load())
	}
	if !bytes.Equal(ps.Content("otelcol"), v1) {
		t.Fatalf("the agent has %d bytes", len(ps.Content("otelcol")))
	}
	// The events are written in batches: wait for the one of the re-send.
	var details []string
	if !fleettest.Eventually(30*time.Second, func() bool {
		rows, err := e.a.Store.Pool.Query(t.Context(), `SELECT replica_id || ': ' || detail FROM agent_events WHERE instance_uid = $1 AND kind = $2 ORDER BY id`,
			uid, opampserver.EventPackagesSent)
		if err != nil {
			return false
		}
		details, _ = pgx.CollectRows(rows, pgx.RowTo[string])
		return len(details) >= 2 && strings.HasPrefix(details[0], "replica-b: ") && !strings.Contains(details[0], "sent again") &&
			strings.HasPrefix(details[len(details)-1], "replica-a: ") && strings.Contains(details[len(details)-1], "sent again")
	}) {
		t.Fatalf("packages_sent events: %q, want the send by replica-b and a re-send by replica-a", details)
	}

	// Acknowledged: no more offers, however many polls and seconds pass.
	sent, polls, since := drop.offers.Load(), drop.polls.Load(), time.Now()
	if !fleettest.Eventually(time.Minute, func() bool {
		return drop.polls.Load() >= polls+4*opampserver.PackageResendPolls && time.Since(since) > opampserver.PackageResendAfter+time.Second
	}) {
		t.Fatalf("the agent stopped polling: %d polls", drop.polls.Load())
	}
	if n := drop.offers.Load(); n != sent {
		t.Fatalf("offers after the agent reported the hash: %d, before %d", n, sent)
	}
}

// switchProxy forwards plain-HTTP OpAMP polls to the replica it points at.
type switchProxy struct {
	target atomic.Pointer[string]
	offers atomic.Int64
}

func (p *switchProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	forwardPoll(w, r, *p.target.Load(), func() bool { p.offers.Add(1); return false })
}

// A plain-HTTP agent that reported a failed install of hash H (its
// download corrupted behind replica-b) is offered the same version, so the
// same H, again: the stored status names H, but for the earlier offer, so
// the new offer is sent (by replica-a, which the agent polls now), and the
// agent installs it.
func TestPlainHTTPAgentGetsTheSameVersionOfferedAgainAfterAFailedInstall(t *testing.T) {
	e := startSoftwareEnv(t, nil)
	sw := &switchProxy{}
	b, a := "http://"+e.b.OpAMPAddr().String(), "http://"+e.a.OpAMPAddr().String()
	sw.target.Store(&b)
	srv := httptest.NewServer(sw)
	t.Cleanup(srv.Close)

	ps := newPkgStore(e.pub)
	var offers offerLog
	uid := startOfferAgent(t, offerAgent{url: srv.URL + "/v1/opamp"}, ps, &offers)
	v1 := e.release(t, "v1.0.0")
	waitAcceptsPackages(t, e.ca, uid)
	var offered struct {
		Offers []artifacts.Offer `json:"offers"`
	}
	if code := e.ca.do(t, "POST", "/api/v1/packages/otelcol/offers", `{"version":"v1.0.0","agents":["`+uid+`"]}`, &offered); code != 200 || len(offered.Offers) != 1 {
		t.Fatalf("offer: %d %+v", code, offered)
	}
	h := hex.EncodeToString(offered.Offers[0].PackageHash())
	var st pkgStatus
	if !fleettest.Eventually(60*time.Second, func() bool {
		st = packageStatus(t, e.ca, uid, "otelcol")
		return st.Status == "PackageStatusEnum_InstallFailed"
	}) {
		t.Fatalf("the corrupted download was not reported as failed: %+v", st)
	}
	if st.OfferedHash != h {
		t.Fatalf("failed status %+v: want the offered hash %s", st, h)
	}
	sent := sw.offers.Load()
	sw.target.Store(&a)
	st = offerAndWait(t, e.ca, uid, "v1.0.0")
	if st.AgentHasHash != h || !bytes.Equal(ps.Content("otelcol"), v1) {
		t.Fatalf("after the offer made again: %+v, %d bytes", st, len(ps.Content("otelcol")))
	}
	if n := sw.offers.Load(); n <= sent {
		t.Fatalf("offers the agent got: %d, %d before the offer made again", n, sent)
	}
}
