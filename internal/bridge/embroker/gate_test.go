package embroker

import (
	"bytes"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// dropAfterPublishing connects a raw MQTT 5 client, writes n QoS 1
// PUBLISH packets in one go and closes the connection without waiting for
// their PUBACKs: the broker reads the packets (buffered) after the peer
// is gone, and its PUBACK writes fail, as they do for a bridge killed
// while its sender has messages in flight.
func dropAfterPublishing(t *testing.T, addr, clientID string, n int) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	c := packets.NewControlPacket(packets.CONNECT)
	c.Content = &packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: clientID, CleanStart: true, Properties: &packets.Properties{}}
	if _, err := c.WriteTo(conn); err != nil {
		t.Fatal(err)
	}
	if p, err := packets.ReadPacket(conn); err != nil || p.Type != packets.CONNACK {
		t.Fatalf("CONNACK: %v %v", p, err)
	}
	var buf bytes.Buffer
	for i := range n {
		p := packets.NewControlPacket(packets.PUBLISH)
		p.Content = &packets.Publish{Topic: "gate/test", QoS: 1, PacketID: uint16(i + 1), Payload: []byte(strconv.Itoa(i)), Properties: &packets.Properties{}}
		if _, err := p.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
}

// A publisher whose connection is gone before the broker acknowledged its
// messages must not leave the takeover gate counting publishes that never
// finish: a gate that does waits out its limit at every later takeover and
// then lets the takeover race the publishes it held (the lab lost messages
// at every failover that way).
func TestTakeoverGateForgetsPublishesOfDroppedClients(t *testing.T) {
	b, err := Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for i := range 5 {
		dropAfterPublishing(t, b.Addr, "dropper-"+strconv.Itoa(i), 500)
	}
	// Bounded polling: the broker processes what it read, then notices the
	// closed connections.
	deadline := time.Now().Add(20 * time.Second)
	for b.gate.inProgress() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the takeover gate still counts %d publishes in progress after every publisher left", b.gate.inProgress())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
