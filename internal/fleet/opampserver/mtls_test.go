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
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/lastseen"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newCA(t *testing.T) testCA {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return testCA{c, key}
}

// issue signs a leaf for cn (a server with 127.0.0.1, or a client).
func (ca testCA) issue(t *testing.T, cn string, server bool) tls.Certificate {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestMutualTLSBindsTheCertificateToTheUID(t *testing.T) {
	st := openStore(t)
	ca, rogue := newCA(t), newCA(t)
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	srv := New(Options{Store: st, Batcher: lastseen.New(st, time.Hour, nil, nil), ReplicaID: "r1", Nonce: "n1", Secret: secret})
	if err := srv.Start("127.0.0.1:0", "/v1/opamp", &tls.Config{Certificates: []tls.Certificate{ca.issue(t, "myriarchd", true)},
		ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(context.Background())
	wss := "wss://" + srv.Addr().String() + "/v1/opamp"
	ctx := context.Background()
	agentWith := func(cert tls.Certificate, uidOf *fleettest.Agent) *fleettest.Agent {
		o := fleettest.AgentOptions{URL: wss, Secret: "no-secret", TLS: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}
		if uidOf != nil {
			o.UID = uidOf.UID
		}
		a, err := fleettest.StartAgent(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Stop(ctx) })
		return a
	}

	// The certificate names the UID: the agent needs no secret.
	probe, _ := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://127.0.0.1:1/x"}) // only for a fresh UID
	probe.Stop(ctx)
	good := agentWith(ca.issue(t, probe.UIDString(), false), probe)
	agentIs(t, st, probe.UIDString(), func(a store.Agent) bool { return a.Status == "online" })

	// A certificate of one UID does not speak for another (refused before
	// the upgrade, as its UID is connected, or closed on its first message).
	other := agentWith(ca.issue(t, probe.UIDString(), false), nil)
	if !fleettest.Eventually(30*time.Second, func() bool { return other.Connects() > 0 || other.ConnectFailures() > 0 }) {
		t.Fatal("the second agent never tried")
	}
	time.Sleep(500 * time.Millisecond)
	if _, err := st.GetAgent(ctx, other.UIDString()); err == nil {
		t.Fatal("a certificate spoke for another UID")
	}
	// A certificate from another CA fails the handshake.
	stranger := agentWith(rogue.issue(t, probe.UIDString(), false), nil)
	if !fleettest.Eventually(30*time.Second, func() bool { return stranger.ConnectFailures() > 0 }) || stranger.Connects() != 0 {
		t.Fatal("a certificate of an unknown CA was accepted")
	}
	// Revocation applies to certificate identities too.
	if _, err := st.RevokeAgent(ctx, probe.UIDString(), "test"); err != nil {
		t.Fatal(err)
	}
	srv.Push(ctx, store.RevokeNotifyPrefix+probe.UIDString())
	n := good.Connects()
	if !fleettest.Eventually(30*time.Second, func() bool { return good.ConnectFailures() > 0 }) {
		t.Fatal("the revoked certificate agent was not refused")
	}
	if good.Connects() != n {
		t.Fatal("the revoked certificate agent connected again")
	}
	if c, err := x509.ParseCertificate(ca.issue(t, "urn-only", false).Certificate[0]); err != nil || CertUID(c) != "" {
		t.Fatalf("a common name that is no UID: %q", CertUID(c))
	}
}
