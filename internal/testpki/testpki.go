// Package testpki makes throwaway certificate authorities and certificates
// for tests of TLS and mutual TLS (P-256 keys, valid from an hour ago for a
// day). Only tests import it.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a test certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

var serial atomic.Int64

func key(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// NewCA returns a new authority named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	k := key(t)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, Key: k}
}

// Issue signs a certificate for name: with server, a server certificate
// whose DNS name is name; otherwise a client certificate.
func (ca *CA) Issue(t testing.TB, name string, server bool) tls.Certificate {
	t.Helper()
	k := key(t)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
	if server {
		tmpl.DNSNames = []string{name}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &k.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k, Leaf: leaf}
}

// Pool is a certificate pool that trusts only ca.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Localhost returns a server configuration for "localhost" signed by a new
// authority, and a client configuration that trusts that authority.
func Localhost(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	ca := NewCA(t, "test CA")
	return &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "localhost", true)}, MinVersion: tls.VersionTLS12},
		&tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", MinVersion: tls.VersionTLS12}
}

// WriteCert writes c's certificate and its key as PEM files.
func WriteCert(t testing.TB, c tls.Certificate, certFile, keyFile string) {
	t.Helper()
	kder, err := x509.MarshalECPrivateKey(c.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	WritePEM(t, certFile, "CERTIFICATE", c.Certificate[0])
	WritePEM(t, keyFile, "EC PRIVATE KEY", kder)
}

// WritePEM writes one PEM block of typ to path, readable by all: a broker
// started as root (mosquitto) reads it after dropping its privileges.
func WritePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
}
