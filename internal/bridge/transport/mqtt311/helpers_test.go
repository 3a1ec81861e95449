package mqtt311

import (
	"fmt"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/mochi-mqtt/server/v2.(*Server).eventLoop"))
}

// waitLimit bounds the waits of this package's tests (testwait.Until).
const waitLimit = 30 * time.Second

// broker is one real broker a test runs against: mosquitto 2.0 (from apt;
// skipped without it unless CI=true) or the embedded mochi-mqtt. Both
// speak MQTT 3.1.1 to 3.1.1 clients.
type broker struct {
	name string
	url  string
	addr string
	// ordersResends is false for mochi-mqtt v2.7.9: it resends a resumed
	// session's in-flight messages sorted by their creation second with an
	// unstable sort, so their order within a second is lost (whatever the
	// client's protocol version). mosquitto resends in order.
	ordersResends bool
}

func brokers(t *testing.T) []func(t *testing.T) broker {
	return []func(t *testing.T) broker{
		func(t *testing.T) broker {
			m := embroker.TestMosquitto(t, "")
			return broker{"mosquitto", "tcp://" + m.Addr, m.Addr, true}
		},
		func(t *testing.T) broker {
			b, err := embroker.Start("", nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close() })
			return broker{"mochi", b.URL, b.Addr, false}
		},
	}
}

// eachBroker runs f against mosquitto and against the embedded broker.
func eachBroker(t *testing.T, f func(t *testing.T, b broker)) {
	for i, start := range brokers(t) {
		t.Run([]string{"mosquitto", "embedded"}[i], func(t *testing.T) { f(t, start(t)) })
	}
}

// publisher is a plain MQTT 3.1.1 client (clean session) that publishes.
func publisher(t *testing.T, url string) paho.Client {
	t.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID(fmt.Sprintf("pub-%d", time.Now().UnixNano())).
		SetProtocolVersion(4).SetAutoReconnect(false).SetConnectTimeout(10 * time.Second))
	if tok := c.Connect(); !tok.WaitTimeout(20*time.Second) || tok.Error() != nil {
		t.Fatalf("publisher connect: %v", tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(250) })
	return c
}

func publish(t *testing.T, c paho.Client, topic string, qos byte, payload string) {
	t.Helper()
	if tok := c.Publish(topic, qos, false, payload); !tok.WaitTimeout(20*time.Second) || tok.Error() != nil {
		t.Fatalf("publish %s: %v", payload, tok.Error())
	}
}
