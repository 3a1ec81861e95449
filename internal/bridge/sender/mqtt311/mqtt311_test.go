package mqtt311_test

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/sender/mqtt311"
	"github.com/myriarch/myriarch/internal/bridge/sender/sendertest"
	"github.com/myriarch/myriarch/internal/faultnet"
	"github.com/myriarch/myriarch/internal/testnet"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/mochi-mqtt/server/v2.(*Server).eventLoop"))
}

// eachBroker runs f against mosquitto 2.0 (skipped without it unless
// CI=true) and the embedded mochi-mqtt, both speaking 3.1.1 to 3.1.1
// clients; addr is host:port.
func eachBroker(t *testing.T, f func(t *testing.T, addr string)) {
	t.Run("mosquitto", func(t *testing.T) { f(t, embroker.TestMosquitto(t, "").Addr) })
	t.Run("embedded", func(t *testing.T) {
		b, err := embroker.Start("", nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		f(t, b.Addr)
	})
}

// subscriber is a 3.1.1 client that records what arrives on filter.
type subscriber struct {
	mu  sync.Mutex
	got []string // topic:payload
}

func subscribe(t *testing.T, addr, filter string) *subscriber {
	t.Helper()
	s := &subscriber{}
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(fmt.Sprintf("sub-%d", time.Now().UnixNano())).
		SetProtocolVersion(4).SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(20*time.Second) || tok.Error() != nil {
		t.Fatalf("subscriber connect: %v", tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(250) })
	tok := c.Subscribe(filter, 2, func(_ paho.Client, m paho.Message) {
		s.mu.Lock()
		s.got = append(s.got, m.Topic()+":"+string(m.Payload()))
		s.mu.Unlock()
	})
	if !tok.WaitTimeout(20*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	return s
}

func (s *subscriber) messages() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

func msg(topic string, i int) *sender.Message {
	return &sender.Message{Topic: topic, Payload: []byte(strconv.Itoa(i)), QoS: 1, Received: time.Now()}
}

func newSender(addr string, qos byte) *mqtt311.Sender {
	return mqtt311.New(mqtt311.Config{Broker: "tcp://" + addr, ClientID: fmt.Sprintf("snd-%d", time.Now().UnixNano()), QoS: qos,
		KeepAlive: 5 * time.Second, ConnectTimeout: 5 * time.Second, Timeout: 10 * time.Second})
}

func closeSender(t *testing.T, s *mqtt311.Sender) {
	t.Helper()
	if err := s.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// At each QoS the sender publishes what it is given in order per topic,
// and reports each message accepted (QoS 1 at its PUBACK, QoS 2 at its
// PUBCOMP); the subscriber receives all of them.
func TestPublishesInOrderAtEachQoS(t *testing.T) {
	eachBroker(t, func(t *testing.T, addr string) {
		for _, qos := range []byte{0, 1, 2} {
			t.Run(fmt.Sprintf("qos%d", qos), func(t *testing.T) {
				topic := fmt.Sprintf("q%d", qos)
				sub := subscribe(t, addr, topic+"/#")
				s := newSender(addr, qos)
				defer closeSender(t, s)
				const n = 400
				var results []chan error
				for i := range n {
					results = append(results, sendertest.Send(s, msg(topic+"/"+[]string{"a", "b"}[i%2], i)))
				}
				for i, ch := range results {
					if err := sendertest.Result(t, ch); err != nil {
						t.Fatalf("message %d: %v", i, err)
					}
				}
				if !sendertest.Eventually(30*time.Second, func() bool { return len(sub.messages()) >= n }) {
					t.Fatalf("subscriber received %d of %d", len(sub.messages()), n)
				}
				checkOrder(t, sub.messages())
			})
		}
	})
}

// checkOrder fails unless, per topic, the first arrivals of the payloads
// (integers) increase.
func checkOrder(t *testing.T, got []string) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int{}
	for _, p := range got {
		if seen[p] {
			continue
		}
		seen[p] = true
		topic, v, _ := strings.Cut(p, ":")
		n, _ := strconv.Atoi(v)
		if l, ok := last[topic]; ok && n < l {
			t.Fatalf("topic %s: %d arrived after %d", topic, n, l)
		}
		last[topic] = n
	}
}

// Cutting the connection fails what was in flight (ErrConnectionLost) or
// queued; sending the failed messages again, as the route does, loses
// nothing once the sender has reconnected.
func TestConnectionCutFailsInFlightThenRecovers(t *testing.T) {
	eachBroker(t, func(t *testing.T, addr string) {
		sub := subscribe(t, addr, "cut/#")
		cut, err := faultnet.Listen(faultnet.Options{}, addr)
		if err != nil {
			t.Fatal(err)
		}
		defer cut.Close()
		s := newSender(cut.Addr(), 1)
		defer closeSender(t, s)
		const n = 300
		var mu sync.Mutex
		failed := 0
		var wg sync.WaitGroup
		var deliver func(i int)
		deliver = func(i int) {
			s.Send(msg("cut/x", i), func(err error) {
				if err == nil {
					wg.Done()
					return
				}
				mu.Lock()
				failed++
				mu.Unlock()
				time.AfterFunc(50*time.Millisecond, func() { deliver(i) })
			})
		}
		wg.Add(n)
		// The first third is accepted; the second is published while the
		// broker's acknowledgments are swallowed, so it is in flight when
		// the connection is cut; the rest follows the cut.
		for i := range n / 3 {
			deliver(i)
		}
		waitAccepted := func(k int) {
			if !sendertest.Eventually(30*time.Second, func() bool { return distinct(sub.messages()) >= k }) {
				t.Fatalf("subscriber received %d distinct, want %d", distinct(sub.messages()), k)
			}
		}
		waitAccepted(n / 3)
		cut.SwallowReplies(true)
		for i := n / 3; i < 2*n/3; i++ {
			deliver(i)
		}
		waitAccepted(2 * n / 3) // published: the broker has them, the sender has no PUBACK
		cut.Cut()
		cut.SwallowReplies(false)
		for i := 2 * n / 3; i < n; i++ {
			deliver(i)
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Fatal("not every message was accepted")
		}
		if !sendertest.Eventually(30*time.Second, func() bool { return distinct(sub.messages()) == n }) {
			t.Fatalf("subscriber received %d distinct of %d", distinct(sub.messages()), n)
		}
		mu.Lock()
		defer mu.Unlock()
		if failed < n/3 {
			t.Fatalf("%d sends failed across the cut, want at least the %d in flight", failed, n/3)
		}
		t.Logf("%d sends failed across the cut and were sent again", failed)
	})
}

func distinct(ps []string) int {
	seen := map[string]bool{}
	for _, p := range ps {
		seen[p] = true
	}
	return len(seen)
}

// MQTT 3.1.1 carries no properties: a message with MQTT 5 properties is
// published without them (its payload arrives), one whose expiry passed
// in the bridge is not published and counts as delivered, and a withdrawn
// one is not attempted.
func TestPropertiesExpiryAndWithdrawal(t *testing.T) {
	b, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sub := subscribe(t, b.Addr, "p/#")
	s := newSender(b.Addr, 1)
	defer closeSender(t, s)
	one := uint32(1)
	expired := &sender.Message{Topic: "p/expired", Payload: []byte("0"), Received: time.Now().Add(-2 * time.Second),
		Properties: &sender.Properties{MessageExpiry: &one}}
	withProps := &sender.Message{Topic: "p/props", Payload: []byte("1"), Received: time.Now(),
		Properties: &sender.Properties{User: []sender.UserProperty{{Key: "k", Value: "v"}}, ContentType: "text/plain"}}
	withdrawn := &sender.Message{Topic: "p/withdrawn", Payload: []byte("2"), Received: time.Now()}
	withdrawn.SetWithdrawn(true)
	for _, c := range []struct {
		m    *sender.Message
		want error
	}{{expired, nil}, {withProps, nil}, {withdrawn, sender.ErrWithdrawn}} {
		if err := sendertest.Result(t, sendertest.Send(s, c.m)); err != c.want {
			t.Fatalf("%s: %v, want %v", c.m.Topic, err, c.want)
		}
	}
	if !sendertest.Eventually(20*time.Second, func() bool { return len(sub.messages()) >= 1 }) {
		t.Fatal("the message with properties did not arrive")
	}
	time.Sleep(200 * time.Millisecond) // let a wrongly published message show up
	if got := sub.messages(); len(got) != 1 || got[0] != "p/props:1" {
		t.Fatalf("received %v, want only p/props:1", got)
	}
}

// A broker nobody answers at fails the queued messages with the reason,
// so that the route's retry and dead-letter policy applies.
func TestUnreachableBrokerFailsQueued(t *testing.T) {
	addr := testnet.DeadAddr(t)
	s := mqtt311.New(mqtt311.Config{Broker: "tcp://" + addr, ClientID: "nobody", QoS: 1, ConnectTimeout: time.Second, Timeout: time.Second})
	defer closeSender(t, s)
	err := sendertest.Result(t, sendertest.Send(s, msg("x", 1)))
	if err == nil || !strings.Contains(err.Error(), "not connected") {
		t.Fatalf("got %v, want a not-connected failure", err)
	}
}
