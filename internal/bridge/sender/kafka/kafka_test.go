package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	kafkasender "github.com/myriarch/myriarch/internal/bridge/sender/kafka"
	"github.com/myriarch/myriarch/internal/bridge/sender/sendertest"
	"github.com/myriarch/myriarch/internal/testnet"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func send(s sender.Sender, m *sender.Message) chan error {
	return sendertest.Send(s, m)
}

var result = sendertest.Result

// Records carry the rewritten topic as key (one partition per topic, so
// its order), the payload as value, the source topic and receive time as
// headers, in order, even when received long before the timeout. A record too large for a batch is a permanent failure; a
// withdrawn message is not produced; after Close, sends fail.
func TestProduceClassifyClose(t *testing.T) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "mqtt"))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	s, err := kafkasender.Dial(kafkasender.Config{Brokers: kc.ListenAddrs(), Topic: "mqtt", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Received long before the timeout: a retried or long-queued message
	// must still be produced (franz-go times records out from their
	// timestamp).
	at := time.Now().Add(-time.Hour).UTC()
	var chans []chan error
	for i := range 30 {
		chans = append(chans, send(s, &sender.Message{Topic: fmt.Sprintf("out/%d", i%3), SourceTopic: "in/x", Payload: fmt.Append(nil, i), Received: at}))
	}
	w := &sender.Message{Topic: "out/0", Payload: []byte("withdrawn")}
	w.SetWithdrawn(true)
	wch := send(s, w)
	for _, ch := range chans {
		if err := result(t, ch); err != nil {
			t.Fatal(err)
		}
	}
	if err := result(t, wch); !errors.Is(err, sender.ErrWithdrawn) {
		t.Fatalf("withdrawn: %v", err)
	}
	err = result(t, send(s, &sender.Message{Topic: "out/big", Payload: make([]byte, 2<<20)}))
	if !sender.IsPermanent(err) || !errors.Is(err, kerr.MessageTooLarge) {
		t.Fatalf("2 MiB record: %v, want a permanent MessageTooLarge", err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := result(t, send(s, &sender.Message{Topic: "t"})); !errors.Is(err, sender.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}

	cons, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.ConsumeTopics("mqtt"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	byKey := map[string][]string{}
	n := 0
	for n < 30 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		fs := cons.PollFetches(ctx)
		timedOut := ctx.Err() != nil
		cancel()
		if timedOut {
			t.Fatalf("consumed %d of 30", n)
		}
		fs.EachRecord(func(r *kgo.Record) {
			n++
			if len(r.Headers) != 2 || r.Headers[0].Key != "mqtt_topic" || string(r.Headers[0].Value) != "in/x" ||
				r.Headers[1].Key != "mqtt_received" || string(r.Headers[1].Value) != at.Format(time.RFC3339Nano) || !r.Timestamp.After(at) {
				t.Errorf("record %s: headers %v, timestamp %v", r.Key, r.Headers, r.Timestamp)
			}
			byKey[string(r.Key)] = append(byKey[string(r.Key)], string(r.Value))
		})
	}
	for k := range 3 {
		var want []string
		for i := k; i < 30; i += 3 {
			want = append(want, fmt.Sprint(i))
		}
		if got := byKey[fmt.Sprintf("out/%d", k)]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("out/%d: %v, want %v", k, got, want)
		}
	}
}

// With no broker reachable, a record fails after the timeout, retryably.
func TestUnreachableTimesOut(t *testing.T) {
	// An address that refuses for the whole test: a port released by a
	// listener could be taken by another test's server meanwhile.
	addr := testnet.DeadAddr(t)
	s, err := kafkasender.Dial(kafkasender.Config{Brokers: []string{addr}, Topic: "mqtt", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if err := result(t, send(s, &sender.Message{Topic: "t", Payload: []byte("x")})); err == nil || sender.IsPermanent(err) {
		t.Fatalf("unreachable: %v, want a retryable error", err)
	}
}

// An exclusive session's record carries the fencing stamp headers.
func TestFenceHeaders(t *testing.T) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	s, err := kafkasender.Dial(kafkasender.Config{Brokers: kc.ListenAddrs(), Topic: "f", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := result(t, send(s, &sender.Message{Topic: "a", Payload: []byte("1"), Fence: fence.New(5, "br/s")})); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.ConsumeTopics("f"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	ctx, cancel := context.WithTimeout(context.Background(), sendertest.ResultLimit)
	defer cancel()
	for {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("no record")
		}
		var recs []*kgo.Record
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
		if len(recs) == 0 {
			continue
		}
		h := map[string]string{}
		for _, kv := range recs[0].Headers {
			h[kv.Key] = string(kv.Value)
		}
		if h[fence.HeaderLeaseVersion] != "5" || h[fence.HeaderSessionID] != "br/s" {
			t.Fatalf("record headers %v", h)
		}
		return
	}
}
