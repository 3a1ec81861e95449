package daemon

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
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

// offerAgent configures an opamp-go agent for the offer tests.
type offerAgent struct {
	url string
	// ws: a WebSocket agent; else plain HTTP, polling every 200 ms.
	ws bool
	// tls, when set, is the agent's TLS config (a client certificate
	// instead of the enrollment secret).
	tls *tls.Config
	// uid, when set, is the agent's instance UID.
	uid types.InstanceUid
}

// startOfferAgent starts an opamp-go agent on linux/amd64 that accepts
// packages, downloads and verifies them through ps, reports their
// statuses, and logs the offers it gets.
func startOfferAgent(t *testing.T, o offerAgent, ps *pkgStore, offers *offerLog) string {
	t.Helper()
	uid := o.uid
	if uid == (types.InstanceUid{}) {
		uid = newUID()
	}
	var c opampclient.OpAMPClient
	if o.ws {
		c = opampclient.NewWebSocket(nil)
	} else {
		hc := opampclient.NewHTTP(nil)
		hc.SetPollingInterval(200 * time.Millisecond)
		c = hc
	}
	kv := func(k, v string) *protobufs.KeyValue {
		return &protobufs.KeyValue{Key: k, Value: &protobufs.AnyValue{Value: &protobufs.AnyValue_StringValue{StringValue: v}}}
	}
	if err := c.SetAgentDescription(&protobufs.AgentDescription{IdentifyingAttributes: []*protobufs.KeyValue{kv("service.name", "offer-agent")},
		NonIdentifyingAttributes: []*protobufs.KeyValue{kv("os.type", "linux"), kv("host.arch", "amd64")}}); err != nil {
		t.Fatal(err)
	}
	hdr := http.Header{"Authorization": []string{"Bearer " + secret}}
	if o.tls != nil {
		hdr = nil
	}
	var syncs sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	err := c.Start(ctx, types.StartSettings{
		OpAMPServerURL: o.url, Header: hdr, TLSConfig: o.tls, InstanceUid: uid,
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

func newUID() types.InstanceUid {
	var uid types.InstanceUid
	_, _ = rand.Read(uid[:])
	uid[6] = (uid[6] & 0x0f) | 0x40
	uid[8] = (uid[8] & 0x3f) | 0x80
	return uid
}

// waitAcceptsPackages waits until uid is registered with AcceptsPackages.
func waitAcceptsPackages(t *testing.T, c client, uid string) {
	t.Helper()
	if !fleettest.Eventually(30*time.Second, func() bool {
		var det struct {
			Agent struct {
				Capabilities uint64 `json:"capabilities"`
			} `json:"agent"`
		}
		return c.do(t, "GET", "/api/v1/agents/"+uid, "", &det) == 200 &&
			det.Agent.Capabilities&uint64(protobufs.AgentCapabilities_AgentCapabilities_AcceptsPackages) != 0
	}) {
		t.Fatalf("agent %s did not register", uid)
	}
}

// offerAndWait offers version to uid through c and waits until the agent
// reports it installed with the offered hash.
func offerAndWait(t *testing.T, c client, uid, version string) pkgStatus {
	t.Helper()
	var offered struct {
		Offers []artifacts.Offer `json:"offers"`
	}
	if code := c.do(t, "POST", "/api/v1/packages/otelcol/offers", fmt.Sprintf(`{"version":%q,"agents":[%q]}`, version, uid), &offered); code != 200 || len(offered.Offers) != 1 {
		t.Fatalf("offer: %d %+v", code, offered)
	}
	var st pkgStatus
	if !fleettest.Eventually(60*time.Second, func() bool {
		st = packageStatus(t, c, uid, "otelcol")
		return st.Status == "PackageStatusEnum_Installed"
	}) {
		t.Fatalf("agent %s: %+v", uid, st)
	}
	if st.AgentHasVersion != version || st.AgentHasHash != hex.EncodeToString(offered.Offers[0].PackageHash()) {
		t.Fatalf("agent %s: %+v", uid, st)
	}
	return st
}

// A plain-HTTP agent gets its package offer in the response to a poll
// (the offer made through the other replica), downloads it with the
// offer's download token, verifies it and reports it installed. The token
// is the agent's own for that artifact: the enrollment secret and the
// token on another artifact are refused by both replicas; the agent's own
// credential is accepted for the offered artifact only.
func TestPlainHTTPAgentGetsOffersDownloadsAndReportsStatus(t *testing.T) {
	e := startSoftwareEnv(t, nil)
	ps := newPkgStore(e.pub)
	var offers offerLog
	uid := startOfferAgent(t, offerAgent{url: "http://" + e.a.OpAMPAddr().String() + "/v1/opamp"}, ps, &offers)
	v1 := e.release(t, "v1.0.0")
	v2 := e.release(t, "v1.1.0")
	waitAcceptsPackages(t, e.ca, uid)
	offerAndWait(t, e.cb, uid, "v1.0.0")
	if !bytes.Equal(ps.Content("otelcol"), v1) {
		t.Fatalf("plain-HTTP agent has %d bytes", len(ps.Content("otelcol")))
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
	// The agent's own credential opens the artifact offered to it (v1)
	// and no other stored one (v2 was released but not offered to it).
	cred, err := e.a.Store.IssueAgentCredential(context.Background(), uid)
	if err != nil {
		t.Fatal(err)
	}
	for _, replica := range []*Daemon{e.a, e.b} {
		for _, c := range []struct {
			digest, auth string
			want         int
		}{{d1, auth, 200}, {d2, auth, 401}, {d1, "Bearer " + secret, 401}, {d1, "", 401}, {d1, "Bearer " + cred, 200}, {d2, "Bearer " + cred, 401}} {
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

// pkiFiles is a throwaway CA with a server certificate for 127.0.0.1, as
// PEM files, and client certificates on demand.
type pkiFiles struct {
	ca                *x509.Certificate
	caKey             *ecdsa.PrivateKey
	caFile            string
	certFile, keyFile string
}

func newPKI(t *testing.T) *pkiFiles {
	t.Helper()
	dir := t.TempDir()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "offer test CA"}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	p := &pkiFiles{caKey: key, caFile: filepath.Join(dir, "ca.pem"), certFile: filepath.Join(dir, "cert.pem"), keyFile: filepath.Join(dir, "key.pem")}
	p.ca, _ = x509.ParseCertificate(der)
	srv := p.issue(t, "myriarchd", true)
	kb, _ := x509.MarshalECPrivateKey(srv.PrivateKey.(*ecdsa.PrivateKey))
	for name, blk := range map[string]*pem.Block{p.caFile: {Type: "CERTIFICATE", Bytes: der}, p.certFile: {Type: "CERTIFICATE", Bytes: srv.Certificate[0]},
		p.keyFile: {Type: "EC PRIVATE KEY", Bytes: kb}} {
		if err := os.WriteFile(name, pem.EncodeToMemory(blk), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func (p *pkiFiles) issue(t *testing.T, cn string, server bool) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// An agent that authenticates with a client certificate (mutual TLS,
// neither the enrollment secret nor a credential) gets offers with a
// download token like any agent and installs the package; once revoked,
// its token no longer downloads.
func TestMutualTLSAgentDownloadsWithItsOffersToken(t *testing.T) {
	p := newPKI(t)
	e := startSoftwareEnv(t, map[string]string{"server.tlsCertFile": p.certFile, "server.tlsKeyFile": p.keyFile, "server.opampClientCaFile": p.caFile})
	uidBytes := newUID()
	agentUID := (&fleettest.Agent{UID: uidBytes}).UIDString()
	roots := x509.NewCertPool()
	roots.AddCert(p.ca)
	ps := newPkgStore(e.pub)
	var offers offerLog
	uid := startOfferAgent(t, offerAgent{url: "wss://" + e.a.OpAMPAddr().String() + "/v1/opamp", ws: true, uid: uidBytes,
		tls: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{p.issue(t, agentUID, false)}, MinVersion: tls.VersionTLS12}}, ps, &offers)
	v1 := e.release(t, "v1.0.0")
	waitAcceptsPackages(t, e.ca, uid)
	offerAndWait(t, e.ca, uid, "v1.0.0")
	if !bytes.Equal(ps.Content("otelcol"), v1) {
		t.Fatalf("mTLS agent has %d bytes", len(ps.Content("otelcol")))
	}
	got := offers.all()
	if len(got) == 0 || !strings.HasPrefix(got[len(got)-1], "Bearer "+artifacts.TokenPrefix) {
		t.Fatalf("offered Authorization headers %q", got)
	}
	sum := sha256.Sum256(v1)
	download := func() int {
		req, _ := http.NewRequest(http.MethodGet, "http://"+e.a.HTTPAddr().String()+artifacts.PathPrefix+"sha256:"+hex.EncodeToString(sum[:]), nil)
		req.Header.Set("Authorization", got[len(got)-1])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := download(); c != 200 {
		t.Fatalf("the mTLS agent's token: %d", c)
	}
	if code := e.ca.do(t, "POST", "/api/v1/agents/"+uid+"/revoke", "", nil); code != 200 {
		t.Fatalf("revoke: %d", code)
	}
	if c := download(); c != 401 {
		t.Fatalf("the revoked mTLS agent's token: %d", c)
	}
}
