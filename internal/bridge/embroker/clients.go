package embroker

import (
	"context"
	"fmt"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/myriarch/myriarch/internal/bridge/mqttconn"
)

// Client is a plain MQTT 5 client for publishers and subscribers in the
// lab, the tests and the benchmarks. Subscribers announce a receive
// maximum of 65535 (mochi stops delivering to a subscriber whose receive
// maximum is used up).
type Client struct {
	*paho.Client
}

// Connect connects a client; onMessage, if set, receives every message
// (and paho acknowledges it after onMessage returns).
func Connect(ctx context.Context, url, clientID string, cleanStart bool, onMessage func(*paho.Publish)) (*Client, error) {
	conn, err := mqttconn.Dial(ctx, url, nil)
	if err != nil {
		return nil, err
	}
	cfg := paho.ClientConfig{ClientID: clientID, Conn: conn}
	if onMessage != nil {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			onMessage(pr.Packet)
			return true, nil
		}}
	}
	c := paho.NewClient(cfg)
	recvMax := uint16(65535)
	expiry := uint32(0)
	if !cleanStart {
		expiry = 3600
	}
	ca, err := c.Connect(ctx, &paho.Connect{ClientID: clientID, CleanStart: cleanStart, KeepAlive: 30,
		// RequestProblemInfo: mochi-mqtt v2.7.9 strips user properties from
		// every packet, PUBLISH included, sent to a client that asked for
		// no problem information (MQTT 5 allows that only for packets
		// other than PUBLISH); the fencing stamp travels in them.
		Properties: &paho.ConnectProperties{ReceiveMaximum: &recvMax, SessionExpiryInterval: &expiry, RequestProblemInfo: true}})
	if err != nil {
		_ = conn.Close()
		if ca != nil {
			return nil, fmt.Errorf("connect: reason %d: %w", ca.ReasonCode, err)
		}
		return nil, err
	}
	return &Client{c}, nil
}

// Subscribe subscribes to filter at qos.
func (c *Client) Subscribe(ctx context.Context, filter string, qos byte) error {
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := c.Client.Subscribe(sctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: qos}}})
	return err
}

// Close disconnects.
func (c *Client) Close() {
	_ = c.Disconnect(&paho.Disconnect{ReasonCode: 0})
	<-c.Done()
}
