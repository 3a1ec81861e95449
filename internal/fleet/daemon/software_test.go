package daemon

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	opampclient "github.com/open-telemetry/opamp-go/client"
	"github.com/open-telemetry/opamp-go/client/types"
	"github.com/open-telemetry/opamp-go/protobufs"

	"github.com/myriarch/myriarch/internal/fleet/artifacts"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/releases/ocitest"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/fleet/upgrades"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// pkgStore is an agent's package store: it keeps what it downloads only
// when the content hash (and, with a key, the ed25519 signature of the
// digest) verifies, as a real agent must.
type pkgStore struct {
	pub ed25519.PublicKey

	mu       sync.Mutex
	allHash  []byte
	states   map[string]types.PackageState
	content  map[string][]byte
	hashes   map[string][]byte
	statuses *protobufs.PackageStatuses
}

func newPkgStore(pub ed25519.PublicKey) *pkgStore {
	return &pkgStore{pub: pub, states: map[string]types.PackageState{}, content: map[string][]byte{}, hashes: map[string][]byte{}}
}

func (p *pkgStore) AllPackagesHash() ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.allHash, nil
}
func (p *pkgStore) SetAllPackagesHash(h []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.allHash = h
	return nil
}
func (p *pkgStore) Packages() ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for k := range p.states {
		out = append(out, k)
	}
	return out, nil
}
func (p *pkgStore) PackageState(name string) (types.PackageState, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.states[name], nil
}
func (p *pkgStore) SetPackageState(name string, s types.PackageState) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.states[name] = s
	return nil
}
func (p *pkgStore) CreatePackage(name string, typ protobufs.PackageType) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.states[name].Exists {
		return fmt.Errorf("package %s exists", name)
	}
	p.states[name] = types.PackageState{Exists: true, Type: typ}
	return nil
}
func (p *pkgStore) FileContentHash(name string) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hashes[name], nil
}
func (p *pkgStore) UpdateContent(ctx context.Context, name string, data io.Reader, contentHash, signature []byte) error {
	b, err := io.ReadAll(data)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	if !bytes.Equal(sum[:], contentHash) {
		return fmt.Errorf("content hash mismatch: downloaded %x, offered %x", sum, contentHash)
	}
	if p.pub != nil && !ed25519.Verify(p.pub, []byte("sha256:"+hex.EncodeToString(sum[:])), signature) {
		return errors.New("signature does not verify")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.content[name], p.hashes[name] = b, contentHash
	return nil
}
func (p *pkgStore) DeletePackage(name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.states, name)
	delete(p.content, name)
	delete(p.hashes, name)
	return nil
}
func (p *pkgStore) LastReportedStatuses() (*protobufs.PackageStatuses, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.statuses, nil
}
func (p *pkgStore) SetLastReportedStatuses(s *protobufs.PackageStatuses) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.statuses = s
	return nil
}
func (p *pkgStore) Content(name string) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.content[name]
}

// startPkgAgent starts an opamp-go WebSocket agent on linux/amd64 that
// accepts packages and reports their statuses.
func startPkgAgent(t *testing.T, opampURL string, ps *pkgStore, extra ...string) (opampclient.OpAMPClient, string) {
	t.Helper()
	var uid types.InstanceUid
	_, _ = rand.Read(uid[:])
	uid[6] = (uid[6] & 0x0f) | 0x40
	uid[8] = (uid[8] & 0x3f) | 0x80
	c := opampclient.NewWebSocket(nil)
	kv := func(k, v string) *protobufs.KeyValue {
		return &protobufs.KeyValue{Key: k, Value: &protobufs.AnyValue{Value: &protobufs.AnyValue_StringValue{StringValue: v}}}
	}
	if err := c.SetAgentDescription(&protobufs.AgentDescription{IdentifyingAttributes: []*protobufs.KeyValue{kv("service.name", "pkg-agent")},
		NonIdentifyingAttributes: append([]*protobufs.KeyValue{kv("os.type", "linux"), kv("host.arch", "amd64")}, extraKVs(extra)...)}); err != nil {
		t.Fatal(err)
	}
	caps := protobufs.AgentCapabilities_AgentCapabilities_ReportsStatus | protobufs.AgentCapabilities_AgentCapabilities_AcceptsPackages |
		protobufs.AgentCapabilities_AgentCapabilities_ReportsPackageStatuses
	var syncs sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	err := c.Start(ctx, types.StartSettings{
		OpAMPServerURL: opampURL, Header: http.Header{"Authorization": []string{"Bearer " + secret}}, InstanceUid: uid,
		PackagesStateProvider: ps, Capabilities: caps,
		Callbacks: types.Callbacks{OnMessage: func(ctx context.Context, msg *types.MessageData) {
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
	return c, a.UIDString()
}

// corruptingProxy forwards to a target set later and flips one byte of
// every artifact body (a broken middlebox between agents and a replica).
type corruptingProxy struct {
	target atomic.Pointer[url.URL]
}

func (p *corruptingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(p.target.Load()) },
		ModifyResponse: func(resp *http.Response) error {
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				return err
			}
			if len(b) > 10 {
				b[10] ^= 0xff
			}
			resp.Body = io.NopCloser(bytes.NewReader(b))
			return nil
		}}
	rp.ServeHTTP(w, r)
}

type pkgStatus struct {
	AgentHasVersion string `json:"agent_has_version"`
	AgentHasHash    string `json:"agent_has_hash"`
	OfferedVersion  string `json:"server_offered_version"`
	OfferedHash     string `json:"server_offered_hash"`
	Status          string `json:"status"`
	Error           string `json:"error"`
}

func packageStatus(t *testing.T, c client, uid, pkg string) pkgStatus {
	t.Helper()
	var det struct {
		Agent store.Agent `json:"agent"`
	}
	c.do(t, "GET", "/api/v1/agents/"+uid, "", &det)
	var ps struct {
		Packages map[string]pkgStatus `json:"packages"`
	}
	_ = json.Unmarshal(det.Agent.PackageStatuses, &ps)
	return ps.Packages[pkg]
}

// A release pushed to a real registry is tracked, prefetched into
// PostgreSQL, offered over OpAMP, downloaded by an opamp-go agent from the
// replica it is connected to, verified and reported installed; a download
// corrupted on the way is reported as failed and not installed.
func TestReleaseFlowsFromRegistryToAnInstalledAgentPackage(t *testing.T) {
	reg := ocitest.Start(t)
	pg := pgtest.New(t)
	ctx := context.Background()

	pub, priv, _ := ed25519.GenerateKey(nil)
	data := bytes.Repeat([]byte("otelcol-contrib v1.0.0 linux/amd64 "), 30_000) // ~1 MB
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	sig := base64.StdEncoding.EncodeToString(ed25519.Sign(priv, []byte(digest)))
	if err := reg.Push(ctx, "agents/otelcol", "v1.0.0", []ocitest.File{{Name: "otelcol_linux_amd64.tar.gz", Data: data, Signature: sig},
		{Name: "otelcol_windows_amd64.zip", Data: []byte("windows")}}); err != nil {
		t.Fatal(err)
	}

	proxy := &corruptingProxy{}
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	psrv := &http.Server{Handler: proxy, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = psrv.Serve(pl) }()
	defer psrv.Close()

	fast := map[string]string{"jobs.releaseTrackerInterval": "1s", "jobs.artifactPrefetchInterval": "1s", "agents.reconcileInterval": "1s"}
	a := start(t, testConfig(t, pg.DSN(""), "replica-a", fast), nil)
	defer a.Shutdown()
	fastB := map[string]string{"artifacts.publicUrl": "http://" + pl.Addr().String()}
	for k, v := range fast {
		fastB[k] = v
	}
	b := start(t, testConfig(t, pg.DSN(""), "replica-b", fastB), nil)
	defer b.Shutdown()
	bURL, _ := url.Parse("http://" + b.HTTPAddr().String())
	proxy.target.Store(bURL)

	tok, err := a.Store.CreateToken(ctx, "admin")
	if err != nil {
		t.Fatal(err)
	}
	ca := client{base: "http://" + a.HTTPAddr().String(), token: tok}
	cb := client{base: "http://" + b.HTTPAddr().String(), token: tok}
	body := fmt.Sprintf(`{"type":"oci","source":%q,"constraint":">= 1.0.0","poll_interval":"1s","public_key":%q}`, reg.Repo("agents/otelcol"), base64.StdEncoding.EncodeToString(pub))
	if code := ca.do(t, "PUT", "/api/v1/packages/otelcol", body, nil); code != 200 {
		t.Fatalf("put package: %d", code)
	}
	if code := ca.do(t, "PUT", "/api/v1/packages/bad", `{"type":"ftp","source":"x","poll_interval":"0s"}`, nil); code != 400 {
		t.Fatalf("invalid package accepted: %d", code)
	}

	good := newPkgStore(pub)
	_, uidGood := startPkgAgent(t, "ws://"+a.OpAMPAddr().String()+"/v1/opamp", good)
	bad := newPkgStore(pub)
	_, uidBad := startPkgAgent(t, "ws://"+b.OpAMPAddr().String()+"/v1/opamp", bad)

	// Tracked and prefetched for the fleet's platform (linux/amd64 only);
	// both replicas show it.
	var arts struct {
		Blobs     []artifacts.Blob     `json:"blobs"`
		Downloads []artifacts.Progress `json:"downloads"`
	}
	if !fleettest.Eventually(60*time.Second, func() bool {
		arts.Blobs = nil
		cb.do(t, "GET", "/api/v1/artifacts", "", &arts)
		return len(arts.Blobs) == 1 && arts.Blobs[0].Digest == digest
	}) {
		t.Fatalf("not prefetched: %+v", arts)
	}

	// Offer it to both agents: the good one installs it, the one behind the
	// corrupting middlebox reports the failure.
	var offered struct {
		Offers []artifacts.Offer `json:"offers"`
	}
	if code := cb.do(t, "POST", "/api/v1/packages/otelcol/offers", fmt.Sprintf(`{"version":"v1.0.0","agents":[%q,%q]}`, uidGood, uidBad), &offered); code != 200 || len(offered.Offers) != 2 {
		t.Fatalf("offer: %d %+v", code, offered)
	}
	wantHash := hex.EncodeToString(offered.Offers[0].PackageHash())
	var st pkgStatus
	if !fleettest.Eventually(60*time.Second, func() bool {
		st = packageStatus(t, ca, uidGood, "otelcol")
		return st.Status == "PackageStatusEnum_Installed"
	}) {
		t.Fatalf("good agent: %+v", st)
	}
	if st.AgentHasVersion != "v1.0.0" || st.AgentHasHash != wantHash || !bytes.Equal(good.Content("otelcol"), data) {
		t.Fatalf("good agent: %+v, %d bytes", st, len(good.Content("otelcol")))
	}
	if !fleettest.Eventually(60*time.Second, func() bool {
		st = packageStatus(t, ca, uidBad, "otelcol")
		return st.Status == "PackageStatusEnum_InstallFailed"
	}) {
		t.Fatalf("corrupted download not reported as failed: %+v", st)
	}
	if !strings.Contains(st.Error, "content hash mismatch") || st.AgentHasVersion == "v1.0.0" || bad.Content("otelcol") != nil {
		t.Fatalf("bad agent: %+v", st)
	}

	// The fleet view: one agent runs otelcol v1.0.0.
	var vs struct {
		Versions []store.PackageVersionCount `json:"versions"`
	}
	ca.do(t, "GET", "/api/v1/packages/versions", "", &vs)
	found := false
	for _, v := range vs.Versions {
		if v.Package == "otelcol" && v.Version == "v1.0.0" {
			found = v.Agents == 1
		}
	}
	if !found {
		t.Fatalf("versions: %+v", vs)
	}
	// Offering an unknown version is refused and changes nothing.
	if code := ca.do(t, "POST", "/api/v1/packages/otelcol/offers", fmt.Sprintf(`{"version":"v9.9.9","agents":[%q]}`, uidGood), nil); code != 409 {
		t.Fatalf("unknown version: %d", code)
	}
}

func extraKVs(kv []string) []*protobufs.KeyValue {
	var out []*protobufs.KeyValue
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, &protobufs.KeyValue{Key: kv[i], Value: &protobufs.AnyValue{Value: &protobufs.AnyValue_StringValue{StringValue: kv[i+1]}}})
	}
	return out
}

type softwareEnv struct {
	reg    *ocitest.Registry
	a, b   *Daemon
	ca, cb client
	pub    ed25519.PublicKey
	priv   ed25519.PrivateKey
}

// startSoftwareEnv starts a registry and two replicas; replica-b offers
// downloads through a proxy that corrupts them.
func startSoftwareEnv(t *testing.T, extra map[string]string) *softwareEnv {
	t.Helper()
	e := &softwareEnv{reg: ocitest.Start(t)}
	pg := pgtest.New(t)
	e.pub, e.priv, _ = ed25519.GenerateKey(nil)
	proxy := &corruptingProxy{}
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	psrv := &http.Server{Handler: proxy, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = psrv.Serve(pl) }()
	t.Cleanup(func() { psrv.Close() })
	fast := map[string]string{"jobs.releaseTrackerInterval": "1s", "jobs.artifactPrefetchInterval": "1s", "agents.reconcileInterval": "1s"}
	for k, v := range extra {
		fast[k] = v
	}
	e.a = start(t, testConfig(t, pg.DSN(""), "replica-a", fast), nil)
	t.Cleanup(func() { e.a.Shutdown() })
	fastB := map[string]string{"artifacts.publicUrl": "http://" + pl.Addr().String()}
	for k, v := range fast {
		fastB[k] = v
	}
	e.b = start(t, testConfig(t, pg.DSN(""), "replica-b", fastB), nil)
	t.Cleanup(func() { e.b.Shutdown() })
	bURL, _ := url.Parse("http://" + e.b.HTTPAddr().String())
	proxy.target.Store(bURL)
	tok, err := e.a.Store.CreateToken(context.Background(), "admin")
	if err != nil {
		t.Fatal(err)
	}
	e.ca = client{base: "http://" + e.a.HTTPAddr().String(), token: tok}
	e.cb = client{base: "http://" + e.b.HTTPAddr().String(), token: tok}
	body := fmt.Sprintf(`{"type":"oci","source":%q,"poll_interval":"1s","public_key":%q}`, e.reg.Repo("agents/otelcol"), base64.StdEncoding.EncodeToString(e.pub))
	if code := e.ca.do(t, "PUT", "/api/v1/packages/otelcol", body, nil); code != 200 {
		t.Fatalf("put package: %d", code)
	}
	return e
}

// release pushes a signed linux/amd64 build and waits until it is stored.
func (e *softwareEnv) release(t *testing.T, version string) []byte {
	t.Helper()
	data := bytes.Repeat([]byte("otelcol "+version+" linux/amd64 "), 10_000)
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	sig := base64.StdEncoding.EncodeToString(ed25519.Sign(e.priv, []byte(digest)))
	if err := e.reg.Push(context.Background(), "agents/otelcol", version, []ocitest.File{{Name: "otelcol_linux_amd64.tar.gz", Data: data, Signature: sig}}); err != nil {
		t.Fatal(err)
	}
	if !fleettest.Eventually(60*time.Second, func() bool {
		var arts struct {
			Blobs []artifacts.Blob `json:"blobs"`
		}
		e.ca.do(t, "GET", "/api/v1/artifacts", "", &arts)
		for _, b := range arts.Blobs {
			if b.Digest == digest {
				return true
			}
		}
		return false
	}) {
		t.Fatalf("%s not prefetched", version)
	}
	return data
}

func (e *softwareEnv) waitRollout(t *testing.T, id int64, state string) upgrades.Rollout {
	t.Helper()
	var got upgrades.Rollout
	if !fleettest.Eventually(90*time.Second, func() bool {
		var l struct {
			Rollouts []upgrades.Rollout `json:"rollouts"`
		}
		e.ca.do(t, "GET", "/api/v1/package-rollouts", "", &l)
		for _, r := range l.Rollouts {
			if r.ID == id {
				got = r
			}
		}
		return got.State == state
	}) {
		t.Fatalf("package rollout %d: want %s, got %+v", id, state, got)
	}
	return got
}

// Upgrades are rollouts: waves behind the gate of package statuses, and a
// failed install (a corrupted download) rolls the others back to their
// previous version.
func TestPackageUpgradeRolloutInWavesAndRollback(t *testing.T) {
	e := startSoftwareEnv(t, map[string]string{"jobs.rolloutInterval": "200ms"})
	wsA := "ws://" + e.a.OpAMPAddr().String() + "/v1/opamp"
	g1, g2, bad := newPkgStore(e.pub), newPkgStore(e.pub), newPkgStore(e.pub)
	_, uid1 := startPkgAgent(t, wsA, g1, "ring", "good")
	_, uid2 := startPkgAgent(t, wsA, g2, "ring", "good")
	_, uidBad := startPkgAgent(t, "ws://"+e.b.OpAMPAddr().String()+"/v1/opamp", bad, "ring", "behind-broken-proxy")
	v1 := e.release(t, "v1.0.0")

	// v1.0.0 to the good ring: a canary of one, then the rest after a bake.
	var ro upgrades.Rollout
	if code := e.ca.do(t, "POST", "/api/v1/packages/otelcol/rollouts", `{"version":"v1.0.0","waves":["1","100%"],"bake_s":1,"apply_timeout_s":60,"selector":{"ring":"good"}}`, &ro); code != 201 {
		t.Fatalf("create: %d", code)
	}
	done := e.waitRollout(t, ro.ID, upgrades.StateSucceeded)
	if done.Waves != 2 || done.Counts[upgrades.AgentInstalled] != 2 {
		t.Fatalf("rollout: %+v", done)
	}
	for _, u := range []string{uid1, uid2} {
		if st := packageStatus(t, e.ca, u, "otelcol"); st.AgentHasVersion != "v1.0.0" {
			t.Fatalf("%s: %+v", u, st)
		}
	}
	if !bytes.Equal(g1.Content("otelcol"), v1) || bad.Content("otelcol") != nil {
		t.Fatal("contents")
	}
	// Waves in order: the canary (first uid) installed before the other was sent.
	var first, second time.Time
	first, second = installedAt(t, e, ro.ID, min(uid1, uid2)), sentAt(t, e, ro.ID, max(uid1, uid2))
	if !second.After(first) {
		t.Fatalf("second wave sent at %s, before the canary installed at %s", second, first)
	}

	// v1.1.0 to everyone; the agent behind the broken proxy fails, which
	// rolls the good ones back to v1.0.0.
	e.release(t, "v1.1.0")
	if code := e.ca.do(t, "POST", "/api/v1/packages/otelcol/rollouts", `{"version":"v1.1.0","waves":["100%"],"bake_s":30,"apply_timeout_s":60,"failure_policy":"rollback","max_failed":0}`, &ro); code != 201 {
		t.Fatalf("create: %d", code)
	}
	rb := e.waitRollout(t, ro.ID, upgrades.StateRolledBack)
	if !strings.Contains(rb.Reason, "1 of 3 agents failed") {
		t.Fatalf("reason: %+v", rb)
	}
	for _, u := range []string{uid1, uid2} {
		var st pkgStatus
		if !fleettest.Eventually(60*time.Second, func() bool {
			st = packageStatus(t, e.ca, u, "otelcol")
			return st.AgentHasVersion == "v1.0.0" && st.Status == "PackageStatusEnum_Installed"
		}) {
			t.Fatalf("%s not back on v1.0.0: %+v", u, st)
		}
	}
	if !bytes.Equal(g2.Content("otelcol"), v1) {
		t.Fatal("g2 does not run the v1.0.0 build again")
	}
	if st := packageStatus(t, e.ca, uidBad, "otelcol"); st.AgentHasVersion == "v1.1.0" {
		t.Fatalf("bad agent: %+v", st)
	}
	// An invalid spec is refused with the field named.
	if code := e.ca.do(t, "POST", "/api/v1/packages/otelcol/rollouts", `{"version":"v1.1.0","failure_policy":"explode"}`, nil); code != 400 {
		t.Fatalf("invalid spec: %d", code)
	}
}

func installedAt(t *testing.T, e *softwareEnv, id int64, uid string) time.Time {
	var at *time.Time
	if err := e.a.Store.Pool.QueryRow(context.Background(), `SELECT installed_at FROM package_rollout_agents WHERE rollout_id = $1 AND instance_uid = $2`, id, uid).Scan(&at); err != nil || at == nil {
		t.Fatalf("installed_at of %s: %v", uid, err)
	}
	return *at
}

func sentAt(t *testing.T, e *softwareEnv, id int64, uid string) time.Time {
	var at *time.Time
	if err := e.a.Store.Pool.QueryRow(context.Background(), `SELECT sent_at FROM package_rollout_agents WHERE rollout_id = $1 AND instance_uid = $2`, id, uid).Scan(&at); err != nil || at == nil {
		t.Fatalf("sent_at of %s: %v", uid, err)
	}
	return *at
}

// An offer whose notification was lost reaches the agent through the
// reconcile (agents.reconcileInterval).
func TestPackageOfferWithoutNotificationIsDeliveredByTheReconcile(t *testing.T) {
	e := startSoftwareEnv(t, nil)
	st := newPkgStore(e.pub)
	_, uid := startPkgAgent(t, "ws://"+e.a.OpAMPAddr().String()+"/v1/opamp", st)
	data := e.release(t, "v1.0.0")
	sum := sha256.Sum256(data)
	var sig string
	if err := e.a.Store.Pool.QueryRow(context.Background(), `SELECT signature FROM package_assets WHERE version = 'v1.0.0'`).Scan(&sig); err != nil {
		t.Fatal(err)
	}
	// Written without the NOTIFY that OfferVersion sends.
	if _, err := e.a.Store.Pool.Exec(context.Background(), `INSERT INTO agent_package_offers (instance_uid, package, version, asset, digest, signature)
		VALUES ($1, 'otelcol', 'v1.0.0', 'otelcol_linux_amd64.tar.gz', $2, $3)`, uid, "sha256:"+hex.EncodeToString(sum[:]), sig); err != nil {
		t.Fatal(err)
	}
	var ps pkgStatus
	if !fleettest.Eventually(60*time.Second, func() bool {
		ps = packageStatus(t, e.ca, uid, "otelcol")
		return ps.Status == "PackageStatusEnum_Installed" && ps.AgentHasVersion == "v1.0.0"
	}) {
		t.Fatalf("not delivered by the reconcile: %+v", ps)
	}
	if !bytes.Equal(st.Content("otelcol"), data) {
		t.Fatal("content")
	}
}
