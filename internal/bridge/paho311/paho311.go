// Package paho311 connects an Eclipse paho.mqtt.golang client (MQTT 3.1.1)
// the way the bridge's 3.1.1 session and sender both need: over
// mqttconn's dialer, within connect_timeout and the caller's context, with
// Paho's own reconnect and connect retry off, so that every reconnect is
// the caller's (and stays inside its activation bound and lease checks).
package paho311

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"

	"github.com/myriarch/myriarch/internal/bridge/mqttconn"
)

// ErrConnectTimeout is wrapped by Connect's error when connect_timeout (or
// the caller's context) ended the attempt.
var ErrConnectTimeout = errors.New("connect_timeout passed")

// Dial says where and how to connect.
type Dial struct {
	Broker   string
	TLS      *tls.Config
	Username string
	Password []byte
	ClientID string
	// Timeout is connect_timeout: dial, TLS, CONNECT and CONNACK.
	Timeout time.Duration
}

// Connect completes CONNECT/CONNACK for a client made from opts (the
// caller's session settings and handlers); it returns the client and
// whether the broker resumed a session. A broker's refusal names its
// CONNACK return code.
func Connect(ctx context.Context, opts *paho.ClientOptions, d Dial) (paho.Client, bool, error) {
	cctx, cancel := context.WithTimeout(ctx, d.Timeout)
	defer cancel()
	var connMu sync.Mutex
	var conn net.Conn
	opts.AddBroker(d.Broker).
		SetClientID(d.ClientID).
		SetProtocolVersion(4). // 3.1.1 exactly, no fallback to 3.1
		SetConnectTimeout(d.Timeout).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetCustomOpenConnectionFn(func(*url.URL, paho.ClientOptions) (net.Conn, error) {
			c, err := mqttconn.Dial(cctx, d.Broker, d.TLS)
			if err != nil {
				return nil, err
			}
			connMu.Lock()
			conn = c
			connMu.Unlock()
			return c, nil
		})
	if d.Username != "" {
		opts.SetUsername(d.Username)
	}
	if len(d.Password) > 0 {
		opts.SetPassword(string(d.Password))
	}
	cli := paho.NewClient(opts)
	tok := cli.Connect()
	select {
	case <-tok.Done():
	case <-cctx.Done():
		// Paho's handshake deadline is connect_timeout too; closing the
		// connection makes sure that the attempt ends now.
		connMu.Lock()
		if conn != nil {
			_ = conn.Close()
		}
		connMu.Unlock()
		<-tok.Done()
		if tok.Error() == nil {
			cli.Disconnect(0)
		}
		return nil, false, fmt.Errorf("%w (%v)", ErrConnectTimeout, d.Timeout)
	}
	ct := tok.(*paho.ConnectToken)
	if err := tok.Error(); err != nil {
		if cctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, false, fmt.Errorf("%w (%v): %v", ErrConnectTimeout, d.Timeout, err)
		}
		if rc := ct.ReturnCode(); rc != packets.Accepted && rc != packets.ErrNetworkError {
			return nil, false, fmt.Errorf("broker refused the connection (CONNACK return code %d): %w", rc, err)
		}
		return nil, false, err
	}
	return cli, ct.SessionPresent(), nil
}
