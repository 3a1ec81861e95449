package mqttconn_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/mqttconn"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	mqttsender "github.com/myriarch/myriarch/internal/bridge/sender/mqtt"
	"github.com/myriarch/myriarch/internal/bridge/transport"
	"github.com/myriarch/myriarch/internal/bridge/transport/mqtt"
	"github.com/myriarch/myriarch/internal/testpki"
)

// pki is a test certificate authority with its files in dir.
type pki struct {
	dir string
	ca  *testpki.CA
	CA  string // PEM file of the CA certificate
}

func newPKI(t *testing.T, dir, name string) *pki {
	t.Helper()
	p := &pki{dir: dir, ca: testpki.NewCA(t, name), CA: filepath.Join(dir, name+"-ca.pem")}
	testpki.WritePEM(t, p.CA, "CERTIFICATE", p.ca.Cert.Raw)
	return p
}

// issue writes a certificate for name (server: DNS SAN name; client: the
// client-auth usage) and its key; it returns the two file names.
func (p *pki) issue(t *testing.T, name string, server bool) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile = filepath.Join(p.dir, name+".pem"), filepath.Join(p.dir, name+".key")
	testpki.WriteCert(t, p.ca.Issue(t, name, server), certFile, keyFile)
	return certFile, keyFile
}

// server is one broker under test: its URL and how to start it.
type brokerSpec struct {
	tls        bool   // TLS listener with the server certificate broker.test
	clientCert bool   // require a client certificate from the CA
	user, pass string // the only allowed user, if set
}

type fixture struct {
	ca, other                 *pki
	serverCert, serverKey     string
	clientCert, clientKey     string
	foreignClient, foreignKey string // a client certificate from another CA
	dir                       string
}

func newFixture(t *testing.T) *fixture {
	dir := t.TempDir()
	f := &fixture{dir: dir, ca: newPKI(t, dir, "ca"), other: newPKI(t, dir, "other")}
	f.serverCert, f.serverKey = f.ca.issue(t, "broker.test", true)
	f.clientCert, f.clientKey = f.ca.issue(t, "bridge-client", false)
	f.foreignClient, f.foreignKey = f.other.issue(t, "foreign-client", false)
	return f
}

// start starts the broker kind ("embedded" or "mosquitto") per spec and
// returns its URL.
func (f *fixture) start(t *testing.T, kind string, spec brokerSpec) string {
	t.Helper()
	scheme := "tcp://"
	if spec.tls {
		scheme = "mqtts://"
	}
	if kind == "mosquitto" {
		conf := "allow_anonymous true\n"
		if spec.user != "" {
			pw := filepath.Join(t.TempDir(), "passwd")
			bin := "mosquitto_passwd"
			if _, err := exec.LookPath(bin); err != nil {
				bin = "/usr/bin/mosquitto_passwd"
			}
			if out, err := exec.Command(bin, "-b", "-c", pw, spec.user, spec.pass).CombinedOutput(); err != nil {
				t.Fatalf("mosquitto_passwd: %v: %s", err, out)
			}
			conf = "allow_anonymous false\npassword_file " + pw + "\n"
		}
		if spec.tls {
			conf += fmt.Sprintf("cafile %s\ncertfile %s\nkeyfile %s\n", f.ca.CA, f.serverCert, f.serverKey)
			if spec.clientCert {
				conf += "require_certificate true\n"
			}
		}
		return scheme + embroker.TestMosquitto(t, conf).Addr
	}
	var opts embroker.Options
	if spec.user != "" {
		opts.Users = map[string]string{spec.user: spec.pass}
	}
	if spec.tls {
		cert, err := tls.LoadX509KeyPair(f.serverCert, f.serverKey)
		if err != nil {
			t.Fatal(err)
		}
		opts.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if spec.clientCert {
			opts.TLS.ClientCAs, opts.TLS.ClientAuth = f.ca.ca.Pool(), tls.RequireAndVerifyClientCert
		}
	}
	b, err := embroker.StartWith("", nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b.URL
}

// client is what the bridge is configured with.
type client struct {
	tls        *mqttconn.TLSFiles
	user, pass string
}

// send publishes one QoS 1 message through the bridge's MQTT sender and
// returns the outcome (nil once the broker acknowledged it).
func send(t *testing.T, url string, c client) error {
	t.Helper()
	tc, err := mqttconn.TLSConfig(c.tls)
	if err != nil {
		t.Fatal(err)
	}
	s := mqttsender.New(mqttsender.Config{Broker: url, ClientID: fmt.Sprintf("tls-out-%d", time.Now().UnixNano()), QoS: 1,
		KeepAlive: 30 * time.Second, ConnectTimeout: 10 * time.Second, TLS: tc, Username: c.user, Password: []byte(c.pass)})
	defer s.Close(context.Background())
	done := make(chan error, 1)
	s.Send(&sender.Message{Topic: "t/x", Payload: []byte("x"), QoS: 1}, func(err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("no outcome within 30s")
		return nil
	}
}

// session runs the bridge's receiving session with c and reports whether
// it reached full service (connected, subscribed) within limit.
func session(t *testing.T, url string, c client, limit time.Duration) bool {
	t.Helper()
	tc, err := mqttconn.TLSConfig(c.tls)
	if err != nil {
		t.Fatal(err)
	}
	s, err := mqtt.New(transport.Config{Brokers: []string{url}, ClientID: fmt.Sprintf("tls-in-%d", time.Now().UnixNano()), CleanStart: true,
		KeepAlive: 30 * time.Second, ConnectTimeout: 10 * time.Second, ReconcileTimeout: 10 * time.Second, UnmatchedGrace: time.Second,
		TLS: tc, Username: c.user, Password: []byte(c.pass), Subscriptions: []transport.Subscription{{Filter: "t/#", QoS: 1}},
		Handler: func(_ *transport.Message, ack func()) { ack() }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if s.Level() == transport.LevelFull {
			return true
		}
	}
	return false
}

// TestTLSAndAuth: server verification (the right CA, a wrong CA refused,
// server_name), mutual TLS and username/password, for the receiving
// session and the MQTT sender, against the embedded broker and mosquitto
// (its password file), with certificates made here.
func TestTLSAndAuth(t *testing.T) {
	f := newFixture(t)
	good := &mqttconn.TLSFiles{CAFile: f.ca.CA, ServerName: "broker.test"}
	cases := []struct {
		name    string
		broker  brokerSpec
		client  client
		refusal string // "" when the connection must work; else part of the sender's error
	}{
		{"server verified with server_name", brokerSpec{tls: true}, client{tls: good}, ""},
		{"wrong CA refused", brokerSpec{tls: true}, client{tls: &mqttconn.TLSFiles{CAFile: f.other.CA, ServerName: "broker.test"}}, "certificate"},
		{"host name checked without server_name", brokerSpec{tls: true}, client{tls: &mqttconn.TLSFiles{CAFile: f.ca.CA}}, "certificate"},
		{"mutual TLS with a client certificate", brokerSpec{tls: true, clientCert: true},
			client{tls: &mqttconn.TLSFiles{CAFile: f.ca.CA, ServerName: "broker.test", CertFile: f.clientCert, KeyFile: f.clientKey}}, ""},
		{"mutual TLS refuses a foreign client certificate", brokerSpec{tls: true, clientCert: true},
			client{tls: &mqttconn.TLSFiles{CAFile: f.ca.CA, ServerName: "broker.test", CertFile: f.foreignClient, KeyFile: f.foreignKey}}, "not connected"},
		{"mutual TLS refuses no client certificate", brokerSpec{tls: true, clientCert: true}, client{tls: good}, "not connected"},
		{"username and password", brokerSpec{user: "bridge", pass: "s3cret"}, client{user: "bridge", pass: "s3cret"}, ""},
		{"wrong password refused", brokerSpec{user: "bridge", pass: "s3cret"}, client{user: "bridge", pass: "guess"}, "refused"},
		{"password over mutual TLS", brokerSpec{tls: true, clientCert: true, user: "bridge", pass: "s3cret"},
			client{tls: &mqttconn.TLSFiles{CAFile: f.ca.CA, ServerName: "broker.test", CertFile: f.clientCert, KeyFile: f.clientKey}, user: "bridge", pass: "s3cret"}, ""},
	}
	for _, kind := range []string{"embedded", "mosquitto"} {
		for _, c := range cases {
			t.Run(kind+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				url := f.start(t, kind, c.broker)
				err := send(t, url, c.client)
				if c.refusal == "" {
					if err != nil {
						t.Fatalf("sender: %v", err)
					}
					if !session(t, url, c.client, 30*time.Second) {
						t.Fatal("the session did not reach full service")
					}
					return
				}
				if err == nil || !strings.Contains(err.Error(), c.refusal) {
					t.Fatalf("sender: got %v, want a refusal mentioning %q", err, c.refusal)
				}
				if session(t, url, c.client, time.Second) {
					t.Fatal("the session reached full service with a configuration the broker must refuse")
				}
			})
		}
	}
}
