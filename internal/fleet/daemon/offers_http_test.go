package daemon

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	opampclient "github.com/open-telemetry/opamp-go/client"
	"github.com/open-telemetry/opamp-go/client/types"
	"github.com/open-telemetry/opamp-go/protobufs"

	"github.com/myriarch/myriarch/internal/fleet/artifacts"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
)

// offerLog keeps the Authorization headers of the files an agent was
// offered.
type offerLog struct {
	mu   sync.Mutex
	auth []string
}

func (l *offerLog) add(pa *protobufs.PackagesAvailable) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range pa.GetPackages() {
		for _, h := range p.GetFile().GetHeaders().GetHeaders() {
			if h.Key == "Authorization" {
				l.auth = append(l.auth, h.Value)
			}
		}
	}
}

func (l *offerLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.auth...)
}

// startHTTPPkgAgent starts an opamp-go plain-HTTP (polling) agent on
// linux/amd64 that accepts packages, downloads and verifies them through
// ps, and reports their statuses.
func startHTTPPkgAgent(t *testing.T, opampURL string, ps *pkgStore, offers *offerLog) string {
	t.Helper()
	var uid types.InstanceUid
	_, _ = rand.Read(uid[:])
	uid[6] = (uid[6] & 0x0f) | 0x40
	uid[8] = (uid[8] & 0x3f) | 0x80
	c := opampclient.NewHTTP(nil)
	c.SetPollingInterval(200 * time.Millisecond)
	kv := func(k, v string) *protobufs.KeyValue {
		return &protobufs.KeyValue{Key: k, Value: &protobufs.AnyValue{Value: &protobufs.AnyValue_StringValue{StringValue: v}}}
	}
	if err := c.SetAgentDescription(&protobufs.AgentDescription{IdentifyingAttributes: []*protobufs.KeyValue{kv("service.name", "http-pkg-agent")},
		NonIdentifyingAttributes: []*protobufs.KeyValue{kv("os.type", "linux"), kv("host.arch", "amd64")}}); err != nil {
		t.Fatal(err)
	}
	var syncs sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	err := c.Start(ctx, types.StartSettings{
		OpAMPServerURL: opampURL, Header: http.Header{"Authorization": []string{"Bearer " + secret}}, InstanceUid: uid,
		PackagesStateProvider: ps,
		Capabilities: protobufs.AgentCapabilities_AgentCapabilities_ReportsStatus | protobufs.AgentCapabilities_AgentCapabilities_AcceptsPackages |
			protobufs.AgentCapabilities_AgentCapabilities_ReportsPackageStatuses,
		Callbacks: types.Callbacks{OnMessage: func(ctx context.Context, msg *types.MessageData) {
			if msg.PackagesAvailable != nil {
				offers.add(msg.PackagesAvailable)
			}
			if msg.PackageSyncer != nil {
				if err := msg.PackageSyncer.Sync(ctx); err == nil {
					syncs.Go(func() { <-msg.PackageSyncer.Done() })
				}
			}
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer scancel()
		_ = c.Stop(sctx)
		cancel()
		syncs.Wait()
	})
	a := fleettest.Agent{UID: uid}
	return a.UIDString()
}

// A plain-HTTP agent gets its package offer in the response to a poll
// (the offer made through the other replica), downloads it with the
// offer's download token, verifies it and reports it installed. The token
// is the agent's own for that artifact: the enrollment secret and the
// token on another artifact are refused by both replicas.
func TestPlainHTTPAgentGetsOffersDownloadsAndReportsStatus(t *testing.T) {
	e := startSoftwareEnv(t, nil)
	ps := newPkgStore(e.pub)
	var offers offerLog
	uid := startHTTPPkgAgent(t, "http://"+e.a.OpAMPAddr().String()+"/v1/opamp", ps, &offers)
	v1 := e.release(t, "v1.0.0")
	v2 := e.release(t, "v1.1.0")
	if !fleettest.Eventually(30*time.Second, func() bool {
		var det struct {
			Agent struct {
				Capabilities uint64 `json:"capabilities"`
			} `json:"agent"`
		}
		return e.ca.do(t, "GET", "/api/v1/agents/"+uid, "", &det) == 200 && det.Agent.Capabilities&uint64(protobufs.AgentCapabilities_AgentCapabilities_AcceptsPackages) != 0
	}) {
		t.Fatal("the plain-HTTP agent did not register")
	}

	var offered struct {
		Offers []artifacts.Offer `json:"offers"`
	}
	if code := e.cb.do(t, "POST", "/api/v1/packages/otelcol/offers", fmt.Sprintf(`{"version":"v1.0.0","agents":[%q]}`, uid), &offered); code != 200 || len(offered.Offers) != 1 {
		t.Fatalf("offer: %d %+v", code, offered)
	}
	var st pkgStatus
	if !fleettest.Eventually(60*time.Second, func() bool {
		st = packageStatus(t, e.ca, uid, "otelcol")
		return st.Status == "PackageStatusEnum_Installed"
	}) {
		t.Fatalf("plain-HTTP agent: %+v", st)
	}
	if st.AgentHasVersion != "v1.0.0" || st.AgentHasHash != hex.EncodeToString(offered.Offers[0].PackageHash()) || !bytes.Equal(ps.Content("otelcol"), v1) {
		t.Fatalf("plain-HTTP agent: %+v, %d bytes", st, len(ps.Content("otelcol")))
	}

	// The offer carried a download token of this agent, not the secret.
	got := offers.all()
	if len(got) == 0 {
		t.Fatal("no Authorization header in the offer")
	}
	auth := got[len(got)-1]
	if !strings.HasPrefix(auth, "Bearer "+artifacts.TokenPrefix) || strings.Contains(auth, secret) || !strings.Contains(auth, "."+uid+".") {
		t.Fatalf("offered Authorization header %q", auth)
	}
	sum1, sum2 := sha256.Sum256(v1), sha256.Sum256(v2)
	d1, d2 := "sha256:"+hex.EncodeToString(sum1[:]), "sha256:"+hex.EncodeToString(sum2[:])
	for _, replica := range []*Daemon{e.a, e.b} {
		for _, c := range []struct {
			digest, auth string
			want         int
		}{{d1, auth, 200}, {d2, auth, 401}, {d1, "Bearer " + secret, 401}, {d1, "", 401}} {
			req, _ := http.NewRequest(http.MethodGet, "http://"+replica.HTTPAddr().String()+artifacts.PathPrefix+c.digest, nil)
			if c.auth != "" {
				req.Header.Set("Authorization", c.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Fatalf("%s: GET %s with %.20q: %d, want %d", replica.cfg.HA.ReplicaID, c.digest[:15], c.auth, resp.StatusCode, c.want)
			}
		}
	}
}
