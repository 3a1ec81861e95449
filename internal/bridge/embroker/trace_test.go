package embroker

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"

	"github.com/myriarch/myriarch/internal/testwait"
)

// syncBuffer is a log sink the broker's goroutines write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// A message mochi gives up on is in the broker's log, with its payload:
// here a QoS 1 subscriber without a session (clean start, no expiry)
// goes away without acknowledging, and its in-flight message ends with
// the session. With the trace on, the message's life is logged too.
func TestDroppedMessagesAreLogged(t *testing.T) {
	for _, trace := range []bool{false, true} {
		if trace {
			t.Setenv(TraceEnv, "1")
		}
		var logs syncBuffer
		b, err := Start("", slog.New(slog.NewTextHandler(&logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		conn, err := net.DialTimeout("tcp", b.Addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		for _, p := range []*packets.ControlPacket{
			{FixedHeader: packets.FixedHeader{Type: packets.CONNECT}, Content: &packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5,
				ClientID: "forgetful", CleanStart: true, Properties: &packets.Properties{}}},
			{FixedHeader: packets.FixedHeader{Type: packets.SUBSCRIBE, Flags: 2}, Content: &packets.Subscribe{PacketID: 1,
				Subscriptions: []packets.SubOptions{{Topic: "drop/#", QoS: 1}}, Properties: &packets.Properties{}}},
		} {
			if _, err := p.WriteTo(conn); err != nil {
				t.Fatal(err)
			}
			if _, err := packets.ReadPacket(conn); err != nil {
				t.Fatal(err)
			}
		}
		pub, err := Connect(context.Background(), b.URL, "publisher", true, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pub.Publish(context.Background(), &paho.Publish{Topic: "drop/1", QoS: 1, Payload: []byte("n/42")}); err != nil {
			t.Fatal(err)
		}
		if p, err := packets.ReadPacket(conn); err != nil || p.Type != packets.PUBLISH {
			t.Fatalf("the subscriber got %v, %v; want the PUBLISH", p, err)
		}
		_ = conn.Close() // no PUBACK
		testwait.Until(t, "the drop in the broker log", 10*time.Second, func() bool { return strings.Contains(logs.String(), "in-flight message dropped") })
		out := logs.String()
		if !strings.Contains(out, "client=forgetful") || !strings.Contains(out, "payload=n/42") {
			t.Errorf("trace %v: the drop does not name the client and payload:\n%s", trace, out)
		}
		if got := strings.Contains(out, "trace queued"); got != trace {
			t.Errorf("trace %v: message life logged %v:\n%s", trace, got, out)
		}
		pub.Close()
		_ = b.Close()
	}
}
