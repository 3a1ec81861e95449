package mqtt311_test

import (
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/sender/mqtt311"
	"github.com/myriarch/myriarch/internal/bridge/sender/sendertest"
	"github.com/myriarch/myriarch/internal/testpki"
)

// The 3.1.1 sender dials through the bridge's TLS configuration and sends
// its credentials: with the right CA and password a message is accepted;
// a server certificate from another CA and a wrong password fail the
// message with the reason.
func TestTLSAndCredentials(t *testing.T) {
	serverTLS, clientTLS := testpki.Localhost(t)
	_, otherCA := testpki.Localhost(t)
	b, err := embroker.StartWith("", nil, embroker.Options{TLS: serverTLS, Users: map[string]string{"bridge": "s3cret"}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, c := range []struct {
		name     string
		tls      *tls.Config
		password string
		want     string // "" accepted
	}{
		{"right CA and password", clientTLS, "s3cret", ""},
		{"another CA", otherCA, "s3cret", "certificate signed by unknown authority"},
		{"wrong password", clientTLS, "guess", "broker refused the connection (CONNACK return code 5): not Authorized"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := mqtt311.New(mqtt311.Config{Broker: b.URL, ClientID: "tls-snd", QoS: 1, Username: "bridge", Password: []byte(c.password),
				TLS: c.tls, ConnectTimeout: 5 * time.Second, Timeout: 5 * time.Second})
			defer closeSender(t, s)
			err := sendertest.Result(t, sendertest.Send(s, &sender.Message{Topic: "tls/x", Payload: []byte("1")}))
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("got %v, want a failure naming %q", err, c.want)
			}
		})
	}
}
