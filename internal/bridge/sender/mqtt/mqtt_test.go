package mqtt_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	mqttsender "github.com/myriarch/myriarch/internal/bridge/sender/mqtt"
	"github.com/myriarch/myriarch/internal/bridge/sender/sendertest"
	"github.com/myriarch/myriarch/internal/testnet"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/mochi-mqtt/server/v2.(*Server).eventLoop"))
}

func send(s *mqttsender.Sender, topic string, payload string) chan error {
	return sendertest.Send(s, &sender.Message{Topic: topic, Payload: []byte(payload), QoS: 1})
}

var wait = sendertest.Result

// The sender publishes in order, reports each PUBACK, survives the broker
// going away (what was in flight fails, so the route retries it) and
// delivers again once the broker is back.
func TestOrderLossAndReconnect(t *testing.T) {
	b, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	sub, err := embroker.Connect(context.Background(), b.URL, "sub", false, func(p *paho.Publish) {
		mu.Lock()
		got = append(got, string(p.Payload))
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Subscribe(context.Background(), "o/#", 1); err != nil {
		t.Fatal(err)
	}
	// The sender dials a relay bound by the test, so that the broker can
	// come back on a fresh port that no other test can have taken.
	r := testnet.NewRelay(t, b.Addr)
	s := mqttsender.New(mqttsender.Config{Broker: "tcp://" + r.Addr(), ClientID: "snd", QoS: 1, KeepAlive: time.Second, ConnectTimeout: time.Second, Timeout: 2 * time.Second})
	var chans []chan error
	for i := range 500 {
		chans = append(chans, send(s, "o/x", fmt.Sprint(i)))
	}
	for _, ch := range chans {
		if err := wait(t, ch); err != nil {
			t.Fatal(err)
		}
	}
	if !sendertest.Eventually(20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 500
	}) {
		mu.Lock()
		t.Fatalf("the subscriber got %d of 500", len(got))
	}
	mu.Lock()
	for i, p := range got {
		if p != fmt.Sprint(i) {
			t.Fatalf("message %d is %q: out of order", i, p)
		}
	}
	mu.Unlock()
	sub.Close()

	r.SetTarget("")
	_ = b.Close()
	// With the broker gone, a send fails (connection lost or not
	// acknowledged in time) instead of hanging.
	if err := wait(t, send(s, "o/x", "lost")); err == nil {
		t.Fatal("a send without a broker succeeded")
	}
	b2, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	r.SetTarget(b2.Addr)
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := wait(t, send(s, "o/x", "again"))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no delivery after the broker returned: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, send(s, "o/x", "closed")); !errors.Is(err, sender.ErrClosed) {
		t.Fatalf("send after Close: %v", err)
	}
}

// A message withdrawn before the sender writes it fails with ErrWithdrawn
// and never reaches the broker; the messages around it do, in order.
func TestWithdrawnIsNotPublished(t *testing.T) {
	b, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var mu sync.Mutex
	var got []string
	sub, err := embroker.Connect(context.Background(), b.URL, "sub-w", true, func(p *paho.Publish) {
		mu.Lock()
		got = append(got, string(p.Payload))
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.Subscribe(context.Background(), "w/#", 1); err != nil {
		t.Fatal(err)
	}
	s := mqttsender.New(mqttsender.Config{Broker: b.URL, ClientID: "snd-w", QoS: 1, KeepAlive: time.Second, ConnectTimeout: time.Second, Timeout: 2 * time.Second})
	defer s.Close(context.Background())
	if err := wait(t, send(s, "w/x", "1")); err != nil {
		t.Fatal(err)
	}
	w := &sender.Message{Topic: "w/x", Payload: []byte("withdrawn"), QoS: 1}
	w.SetWithdrawn(true)
	wch := make(chan error, 1)
	s.Send(w, func(err error) { wch <- err })
	if err := wait(t, send(s, "w/x", "2")); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, wch); !errors.Is(err, sender.ErrWithdrawn) {
		t.Fatalf("withdrawn message: %v, want ErrWithdrawn", err)
	}
	sendertest.Eventually(20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := len(got)
		return n >= 2
	})
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(got) != "[1 2]" {
		t.Fatalf("subscriber got %v, want [1 2]", got)
	}
}

// denyHook lets every client connect and refuses publishes to deny/#.
type denyHook struct{ mochi.HookBase }

func (h *denyHook) ID() string { return "deny" }
func (h *denyHook) Provides(b byte) bool {
	return b == mochi.OnConnectAuthenticate || b == mochi.OnACLCheck
}
func (h *denyHook) OnConnectAuthenticate(*mochi.Client, packets.Packet) bool { return true }
func (h *denyHook) OnACLCheck(_ *mochi.Client, topic string, write bool) bool {
	return !write || !strings.HasPrefix(topic, "deny/")
}

// A PUBACK that refuses the message itself (not authorized) is a permanent
// failure, and the connection goes on serving the next message.
func TestRefusalIsPermanent(t *testing.T) {
	// The broker serves on a listener bound here: a port picked free and
	// bound later could be taken by another test in between.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	srv := mochi.New(&mochi.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), InlineClient: true})
	if err := srv.AddHook(&denyHook{}, nil); err != nil {
		t.Fatal(err)
	}
	if err := srv.AddListener(listeners.NewNet("t", ln)); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	s := mqttsender.New(mqttsender.Config{Broker: "tcp://" + addr, ClientID: "snd-deny", QoS: 1, KeepAlive: time.Second, ConnectTimeout: time.Second, Timeout: 5 * time.Second})
	defer s.Close(context.Background())
	err = wait(t, send(s, "deny/x", "no"))
	if !sender.IsPermanent(err) {
		t.Fatalf("refused publish: %v, want a permanent error", err)
	}
	if err := wait(t, send(s, "ok/x", "yes")); err != nil {
		t.Fatalf("after a refusal: %v", err)
	}
	for code, want := range map[byte]bool{0x87: true, 0x90: true, 0x99: true, 0x80: false, 0x83: false, 0x91: false, 0x97: false} {
		if mqttsender.PermanentReason(code) != want {
			t.Errorf("PermanentReason(%#x) = %v", code, !want)
		}
	}
}

type tenure struct{ ok atomic.Bool }

func (t *tenure) Valid() bool { return t.ok.Load() }

// A message of an exclusive session carries its fencing stamp as MQTT 5
// user properties; a non-exclusive one carries none; a message whose
// tenure ended is not published at all.
func TestFenceStampAndTenure(t *testing.T) {
	b, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	type got struct{ payload, version, session string }
	ch := make(chan got, 10)
	sub, err := embroker.Connect(context.Background(), b.URL, "sub-f", true, func(p *paho.Publish) {
		g := got{payload: string(p.Payload)}
		if p.Properties != nil {
			g.version = p.Properties.User.Get(fence.MQTTLeaseVersion)
			g.session = p.Properties.User.Get(fence.MQTTSessionID)
		}
		ch <- g
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.Subscribe(context.Background(), "f/#", 1); err != nil {
		t.Fatal(err)
	}
	s := mqttsender.New(mqttsender.Config{Broker: b.URL, ClientID: "snd-f", QoS: 1, KeepAlive: time.Second, ConnectTimeout: time.Second, Timeout: 2 * time.Second})
	defer s.Close(context.Background())
	ten := &tenure{}
	ten.ok.Store(true)
	stamped := &sender.Message{Topic: "f/x", Payload: []byte("stamped"), QoS: 1, Fence: fence.New(42, "br/s1"), Tenure: ten}
	if err := wait(t, sendertest.Send(s, stamped)); err != nil {
		t.Fatal(err)
	}
	ten.ok.Store(false)
	late := &sender.Message{Topic: "f/x", Payload: []byte("late"), QoS: 1, Fence: fence.New(42, "br/s1"), Tenure: ten}
	if err := wait(t, sendertest.Send(s, late)); !errors.Is(err, sender.ErrWithdrawn) {
		t.Fatalf("message of an ended tenure: %v, want ErrWithdrawn", err)
	}
	if err := wait(t, send(s, "f/x", "plain")); err != nil {
		t.Fatal(err)
	}
	want := []got{{"stamped", "42", "br/s1"}, {"plain", "", ""}}
	for _, w := range want {
		select {
		case g := <-ch:
			if g != w {
				t.Fatalf("subscriber got %+v, want %+v", g, w)
			}
		case <-time.After(sendertest.ResultLimit):
			t.Fatalf("subscriber never got %+v", w)
		}
	}
}
