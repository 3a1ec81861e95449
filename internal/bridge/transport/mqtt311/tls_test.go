package mqtt311

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/transport"
	"github.com/myriarch/myriarch/internal/testpki"
	"github.com/myriarch/myriarch/internal/testwait"
)

// The 3.1.1 session dials through the bridge's TLS configuration and
// sends its credentials: with the right CA and password it serves; a
// server certificate from another CA and a wrong password are refused,
// each with its reason.
func TestTLSAndCredentials(t *testing.T) {
	serverTLS, clientTLS := testpki.Localhost(t)
	_, otherCA := testpki.Localhost(t)
	b, err := embroker.StartWith("", nil, embroker.Options{TLS: serverTLS, Users: map[string]string{"bridge": "s3cret"}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cfg := testConfig(b.URL, "tls-bridge", func(_ *transport.Message, ack func()) { ack() })
	cfg.ConnectTimeout = 5 * time.Second
	cfg.Username, cfg.Password, cfg.TLS = "bridge", []byte("s3cret"), clientTLS
	s, _ := start(t, cfg)
	testwait.Until(t, "full over TLS with credentials", waitLimit, func() bool { return s.Level() == transport.LevelFull })

	for _, c := range []struct {
		name string
		edit func(*transport.Config)
		want string
	}{
		{"another CA", func(c *transport.Config) { c.TLS = otherCA }, "certificate signed by unknown authority"},
		{"wrong password", func(c *transport.Config) { c.Password = []byte("guess") }, "broker refused the connection (CONNACK return code 5): not Authorized"},
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
