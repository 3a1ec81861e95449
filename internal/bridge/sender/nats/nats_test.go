package nats_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	natssender "github.com/myriarch/myriarch/internal/bridge/sender/nats"
	"github.com/myriarch/myriarch/internal/bridge/sender/sendertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"))
}

func send(s sender.Sender, topic string, payload []byte) chan error {
	return sendertest.Send(s, &sender.Message{Topic: topic, Payload: payload})
}

var result = sendertest.Result

func startServer(t *testing.T, maxPayload int32) *natsserver.Server {
	t.Helper()
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, MaxPayload: maxPayload})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	return ns
}

func TestSubject(t *testing.T) {
	for _, c := range []struct{ prefix, topic, want string }{
		{"", "a/b/c", "a.b.c"},
		{"bridge", "a/b", "bridge.a.b"},
		{"bridge.", "/a/b/", "bridge.a.b"},
		{"", "a b/*/>", "a_b._._"},
	} {
		if got := natssender.Subject(c.prefix, c.topic); got != c.want {
			t.Errorf("Subject(%q, %q) = %q, want %q", c.prefix, c.topic, got, c.want)
		}
	}
}

// Messages arrive in order on their subjects. A payload above the server's
// max_payload is a permanent failure; the other topic is not held back by
// it. With the server gone, a flush fails (retryably) instead of hanging.
func TestDeliverClassifyAndServerLoss(t *testing.T) {
	ns := startServer(t, 1024)
	nc, err := natsgo.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var mu sync.Mutex
	var got []string
	if _, err := nc.Subscribe("p.>", func(m *natsgo.Msg) {
		mu.Lock()
		got = append(got, m.Subject+"="+string(m.Data))
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	s, err := natssender.Dial(natssender.Config{URL: ns.ClientURL(), SubjectPrefix: "p", Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var chans []chan error
	for i := range 50 {
		chans = append(chans, send(s, "a/x", fmt.Append(nil, i)))
	}
	for _, ch := range chans {
		if err := result(t, ch); err != nil {
			t.Fatal(err)
		}
	}
	big, other := send(s, "a/x", make([]byte, 4096)), send(s, "b/x", []byte("ok"))
	if err := result(t, big); !sender.IsPermanent(err) || !errors.Is(err, natsgo.ErrMaxPayload) {
		t.Fatalf("oversized payload: %v, want a permanent ErrMaxPayload", err)
	}
	if err := result(t, other); err != nil {
		t.Fatalf("the other topic: %v", err)
	}
	sendertest.Eventually(20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := len(got)
		return n >= 51
	})
	mu.Lock()
	if len(got) != 51 || got[50] != "p.b.x=ok" {
		t.Fatalf("subscriber got %d: %v", len(got), got)
	}
	for i := range 50 {
		if want := fmt.Sprintf("p.a.x=%d", i); got[i] != want {
			t.Fatalf("#%d = %q, want %q", i, got[i], want)
		}
	}
	mu.Unlock()

	ns.Shutdown()
	ns.WaitForShutdown()
	if err := result(t, send(s, "a/x", []byte("lost"))); err == nil || sender.IsPermanent(err) {
		t.Fatalf("without a server: %v, want a retryable error", err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := result(t, send(s, "a/x", nil)); !errors.Is(err, sender.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// An exclusive session's message carries the fencing stamp headers; a
// non-exclusive one's carries none.
func TestFenceHeaders(t *testing.T) {
	ns := startServer(t, 1024)
	nc, err := natsgo.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	got := make(chan [3]string, 2)
	if _, err := nc.Subscribe("f.>", func(m *natsgo.Msg) {
		got <- [3]string{string(m.Data), m.Header.Get(fence.HeaderLeaseVersion), m.Header.Get(fence.HeaderSessionID)}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	s, err := natssender.Dial(natssender.Config{URL: ns.ClientURL(), SubjectPrefix: "f", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if err := result(t, sendertest.Send(s, &sender.Message{Topic: "a", Payload: []byte("1"), Fence: fence.New(3, "br/s")})); err != nil {
		t.Fatal(err)
	}
	if err := result(t, send(s, "a", []byte("2"))); err != nil {
		t.Fatal(err)
	}
	for _, want := range [][3]string{{"1", "3", "br/s"}, {"2", "", ""}} {
		select {
		case g := <-got:
			if g != want {
				t.Fatalf("got %q, want %q", g, want)
			}
		case <-time.After(sendertest.ResultLimit):
			t.Fatalf("never got %q", want)
		}
	}
}
