package mqtt311

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/transport/mqtt"
)

// testCA returns a server TLS configuration for "localhost" signed by a
// new CA, and a client configuration that trusts that CA.
func testCA(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12},
		&tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
}

// The 3.1.1 session dials through the bridge's TLS configuration and
// sends its credentials: with the right CA and password it serves; a
// server certificate from another CA and a wrong password are refused,
// each with its reason.
func TestTLSAndCredentials(t *testing.T) {
	serverTLS, clientTLS := testCA(t)
	_, otherCA := testCA(t)
	b, err := embroker.StartWith("", nil, embroker.Options{TLS: serverTLS, Users: map[string]string{"bridge": "s3cret"}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cfg := testConfig(b.URL, "tls-bridge", func(_ *mqtt.Message, ack func()) { ack() })
	cfg.ConnectTimeout = 5 * time.Second
	cfg.Username, cfg.Password, cfg.TLS = "bridge", []byte("s3cret"), clientTLS
	s, _ := start(t, cfg)
	waitFor(t, "full over TLS with credentials", func() bool { return s.Level() == mqtt.LevelFull })

	for _, c := range []struct {
		name string
		edit func(*mqtt.Config)
		want string
	}{
		{"another CA", func(c *mqtt.Config) { c.TLS = otherCA }, "certificate signed by unknown authority"},
		{"wrong password", func(c *mqtt.Config) { c.Password = []byte("guess") }, "broker refused the connection (CONNACK return code 5): not Authorized"},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := cfg
			bad.ClientID = "tls-bad"
			c.edit(&bad)
			s, err := New(bad)
			if err != nil {
				t.Fatal(err)
			}
			err = s.connection(context.Background(), 0)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("connection ended with %v, want a refusal naming %q", err, c.want)
			}
		})
	}
}
