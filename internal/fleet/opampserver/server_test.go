package opampserver

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/lastseen"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const secret = "test-enrollment-secret"

type rig struct {
	st  *store.Store
	b   *lastseen.Batcher
	srv *Server
	ws  string
	url string
}

func newRig(t *testing.T, st *store.Store, replica, nonce string) *rig {
	t.Helper()
	b := lastseen.New(st, time.Hour, nil, nil)
	srv := New(Options{Store: st, Batcher: b, ReplicaID: replica, Nonce: nonce, Secret: secret})
	if err := srv.Start("127.0.0.1:0", "/v1/opamp", nil); err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr().String()
	return &rig{st: st, b: b, srv: srv, ws: "ws://" + addr + "/v1/opamp", url: "http://" + addr + "/v1/opamp"}
}

func (r *rig) stop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.srv.Stop(ctx); err != nil {
		t.Error(err)
	}
}

func agentIs(t *testing.T, st *store.Store, uid string, cond func(store.Agent) bool) store.Agent {
	t.Helper()
	var a store.Agent
	if !fleettest.Eventually(30*time.Second, func() bool {
		var err error
		a, err = st.GetAgent(context.Background(), uid)
		return err == nil && cond(a)
	}) {
		t.Fatalf("agent %s never reached the expected state; last %+v", uid, a)
	}
	return a
}

func TestAgentsOverWebSocketAndHTTP(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	st, err := store.Open(ctx, pg.DSN(""), 8, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r := newRig(t, st, "replica-a", "n1")

	// A wrong secret is refused with 401.
	req, _ := http.NewRequest("POST", r.url, strings.NewReader(""))
	req.Header.Set("Authorization", "Bearer wrong")
	req.Header.Set("Content-Type", "application/x-protobuf")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong secret: %d", resp.StatusCode)
	}

	ws, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: r.ws, Secret: secret, Attrs: map[string]string{"env": "prod"}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Stop(ctx)
	hp, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: r.url, Secret: secret, HTTP: true, Heartbeat: 100 * time.Millisecond, FailConfig: true})
	if err != nil {
		t.Fatal(err)
	}
	defer hp.Stop(ctx)

	a := agentIs(t, st, ws.UIDString(), func(a store.Agent) bool { return a.Identifying["env"] == "prod" && a.Healthy != nil })
	if a.Status != "online" || a.ReplicaID != "replica-a" || a.Identifying["service.name"] != "test-agent" || a.NonIdentifying["os.type"] != "linux" || !*a.Healthy {
		t.Fatalf("ws agent: %+v", a)
	}
	agentIs(t, st, hp.UIDString(), func(a store.Agent) bool { return a.Status == "online" && a.Identifying["service.name"] == "test-agent" })

	// Remote config: stored, pushed to the WebSocket agent, status tracked back.
	hash, err := st.SetDesiredConfig(ctx, ws.UIDString(), "exporters: {debug: {}}\n")
	if err != nil {
		t.Fatal(err)
	}
	r.srv.Push(ctx, ws.UIDString())
	a = agentIs(t, st, ws.UIDString(), func(a store.Agent) bool { return a.RemoteConfigStatus == "applied" })
	if a.RemoteConfigHash != hash || a.EffectiveConfig != "exporters: {debug: {}}\n" {
		t.Fatalf("after apply: %+v", a)
	}
	// The HTTP agent gets it on its next poll and reports failure.
	if _, err := st.SetDesiredConfig(ctx, hp.UIDString(), "bad: config\n"); err != nil {
		t.Fatal(err)
	}
	r.srv.Push(ctx, hp.UIDString())
	a = agentIs(t, st, hp.UIDString(), func(a store.Agent) bool { return a.RemoteConfigStatus == "failed" })
	if a.RemoteConfigError != "refused by test agent" {
		t.Fatalf("http agent: %+v", a)
	}

	if err := r.b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	evs, _ := st.Events(ctx, ws.UIDString(), 100)
	kinds := map[string]bool{}
	for _, e := range evs {
		kinds[e.Kind] = true
	}
	for _, k := range []string{store.EventConnected, store.EventConfigSent, store.EventConfigApplied} {
		if !kinds[k] {
			t.Errorf("event %s missing: %v", k, evs)
		}
	}

	// A normal disconnect marks the agent offline at once.
	if err := ws.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	agentIs(t, st, ws.UIDString(), func(a store.Agent) bool { return a.Status == "offline" })
	r.stop(t)
}

func TestStopClosesConnectionsAndFinalFlushMarksOffline(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	st, err := store.Open(ctx, pg.DSN(""), 8, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r := newRig(t, st, "replica-a", "n1")
	var agents []*fleettest.Agent
	for range 5 {
		a, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: r.ws, Secret: secret})
		if err != nil {
			t.Fatal(err)
		}
		agents = append(agents, a)
	}
	defer func() {
		for _, a := range agents {
			a.Stop(ctx)
		}
	}()
	if !fleettest.Eventually(30*time.Second, func() bool { c, _ := st.Counts(ctx); return c.Online == 5 }) {
		t.Fatal("agents not online")
	}
	r.stop(t)
	if n := r.srv.Connections(); n != 0 {
		t.Fatalf("%d connections open after Stop", n)
	}
	// Until the final flush the rows still say online (a killed replica
	// would leave them to the offline sweeper).
	if c, _ := st.Counts(ctx); c.Online != 5 {
		t.Fatalf("online before final flush: %+v", c)
	}
	fctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := r.srv.FinalFlush(fctx); err != nil {
		t.Fatal(err)
	}
	if c, _ := st.Counts(ctx); c.Offline != 5 {
		t.Fatalf("after final flush: %+v", c)
	}
	evs, _ := st.Events(ctx, agents[0].UIDString(), 10)
	if len(evs) == 0 || evs[0].Kind != store.EventDisconnected || evs[0].Detail != "replica stopped" {
		t.Fatalf("events: %+v", evs)
	}
}

func selfSigned(t *testing.T) (*tls.Config, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "myriarchd"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, pool
}

// TLS on the OpAMP listener, and the reconcile as the safety net for a
// change whose notification was lost.
func TestTLSAndReconcileDeliversALostChange(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	st, err := store.Open(ctx, pg.DSN(""), 8, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srvTLS, pool := selfSigned(t)
	b := lastseen.New(st, time.Hour, nil, nil)
	srv := New(Options{Store: st, Batcher: b, ReplicaID: "r", Nonce: "n", Secret: secret})
	if err := srv.Start("127.0.0.1:0", "/v1/opamp", srvTLS); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		srv.Stop(sctx)
	}()
	ag, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "wss://" + srv.Addr().String() + "/v1/opamp", Secret: secret,
		TLS: &tls.Config{RootCAs: pool}})
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Stop(ctx)
	agentIs(t, st, ag.UIDString(), func(a store.Agent) bool { return a.Status == "online" })
	// Change the desired config behind the bus's back (no NOTIFY, no Push).
	if _, err := st.Pool.Exec(ctx, `UPDATE agents SET desired_config = 'lost: notification', desired_config_hash = $2 WHERE instance_uid = $1`,
		ag.UIDString(), store.ConfigHash("lost: notification")); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	agentIs(t, st, ag.UIDString(), func(a store.Agent) bool {
		return a.RemoteConfigStatus == "applied" && a.EffectiveConfig == "lost: notification"
	})
	// A second reconcile does not send it again.
	n := len(ag.Configs())
	if err := srv.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if len(ag.Configs()) != n {
		t.Fatalf("config resent: %v", ag.Configs())
	}
}
