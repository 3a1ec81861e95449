package amqp_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqpgo "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	amqpsender "github.com/myriarch/myriarch/internal/bridge/sender/amqp"
	"github.com/myriarch/myriarch/internal/bridge/sender/amqp/amqptest"
	"github.com/myriarch/myriarch/internal/bridge/sender/amqp/routingkey"
	"github.com/myriarch/myriarch/internal/bridge/sender/sendertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// topology declares a durable topic exchange x and a durable queue q bound
// to it with key, through a connection of the test's own.
func topology(t *testing.T, url, x, q, key string) *amqpgo.Channel {
	t.Helper()
	conn, err := amqpgo.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if x != "" {
		if err := ch.ExchangeDeclare(x, "topic", true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if x != "" {
		if err := ch.QueueBind(q, key, x, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	return ch
}

// drain takes every message from q.
func drain(t *testing.T, url, q string) []amqpgo.Delivery {
	t.Helper()
	conn, err := amqpgo.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var out []amqpgo.Delivery
	for {
		d, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

func closeSender(t *testing.T, s *amqpsender.Sender) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Errorf("close: %v", err)
	}
}

func TestPublishesConfirmedPersistentWithStampAndKey(t *testing.T) {
	node := amqptest.Start(t)
	topology(t, node.URL(), "mqtt", "sensors", "site.#")
	s := amqpsender.New(amqpsender.Config{URL: node.URL(), Exchange: "mqtt", Mandatory: true, Timeout: 10 * time.Second, Name: "test"})
	defer closeSender(t, s)

	received := time.Date(2026, 12, 2, 10, 0, 0, 123, time.UTC)
	for i := range 3 {
		m := &sender.Message{Topic: "site/a/temp", SourceTopic: "in/site/a/temp", Payload: []byte("m" + strconv.Itoa(i)),
			Received: received, Fence: fence.New(42, "b/s")}
		if err := sendertest.Result(t, sendertest.Send(s, m)); err != nil {
			t.Fatalf("message %d not accepted: %v", i, err)
		}
	}
	got := drain(t, node.URL(), "sensors")
	if len(got) != 3 {
		t.Fatalf("queue holds %d messages, want 3", len(got))
	}
	for i, d := range got {
		if string(d.Body) != "m"+strconv.Itoa(i) {
			t.Errorf("message %d: body %q (order or content)", i, d.Body)
		}
		if d.RoutingKey != "site.a.temp" || d.Exchange != "mqtt" {
			t.Errorf("message %d: exchange %q key %q", i, d.Exchange, d.RoutingKey)
		}
		if d.DeliveryMode != amqpgo.Persistent {
			t.Errorf("message %d: delivery mode %d, want persistent", i, d.DeliveryMode)
		}
		st, ok := fence.Parse(fmt.Sprint(d.Headers[fence.HeaderLeaseVersion]), fmt.Sprint(d.Headers[fence.HeaderSessionID]))
		if !ok || st.LeaseVersion != 42 || st.SessionID != "b/s" {
			t.Errorf("message %d: stamp headers %v", i, d.Headers)
		}
		if d.Headers["mqtt_topic"] != "in/site/a/temp" || d.Headers["mqtt_received"] != received.Format(time.RFC3339Nano) {
			t.Errorf("message %d: headers %v", i, d.Headers)
		}
	}

	// A message of a non-exclusive session carries no stamp.
	if err := sendertest.Result(t, sendertest.Send(s, &sender.Message{Topic: "site/b", SourceTopic: "site/b", Payload: []byte("x")})); err != nil {
		t.Fatal(err)
	}
	got = drain(t, node.URL(), "sensors")
	if len(got) != 1 || got[0].Headers[fence.HeaderLeaseVersion] != nil {
		t.Fatalf("unstamped message: %d messages, headers %v", len(got), got[0].Headers)
	}
}

func TestUnroutableAndMissingAreNotAccepted(t *testing.T) {
	node := amqptest.Start(t)
	topology(t, node.URL(), "mqtt", "only-a", "a.#")

	// Mandatory: a message no queue takes is returned, so not accepted.
	s := amqpsender.New(amqpsender.Config{URL: node.URL(), Exchange: "mqtt", Mandatory: true, Timeout: 10 * time.Second})
	err := sendertest.Result(t, sendertest.Send(s, &sender.Message{Topic: "b/x", SourceTopic: "b/x", Payload: []byte("lost?")}))
	if err == nil || !strings.Contains(err.Error(), "unroutable") || !strings.Contains(err.Error(), `"b.x"`) {
		t.Fatalf("unroutable message: %v, want an unroutable error naming the key", err)
	}
	if err := sendertest.Result(t, sendertest.Send(s, &sender.Message{Topic: "a/x", SourceTopic: "a/x", Payload: []byte("ok")})); err != nil {
		t.Fatalf("routable message after a returned one: %v", err)
	}
	closeSender(t, s)

	// The default exchange routes by queue name: a fixed key.
	s = amqpsender.New(amqpsender.Config{URL: node.URL(), RoutingKey: routingkey.MustParse("only-a"), Mandatory: true})
	if err := sendertest.Result(t, sendertest.Send(s, &sender.Message{Topic: "z", SourceTopic: "z", Payload: []byte("direct")})); err != nil {
		t.Fatalf("default exchange: %v", err)
	}
	closeSender(t, s)
	if got := drain(t, node.URL(), "only-a"); len(got) != 2 {
		t.Fatalf("queue holds %d messages, want 2", len(got))
	}

	// An exchange that does not exist: nothing is accepted, and the error
	// names it.
	s = amqpsender.New(amqpsender.Config{URL: node.URL(), Exchange: "nope", Timeout: 5 * time.Second})
	err = sendertest.Result(t, sendertest.Send(s, &sender.Message{Topic: "a", SourceTopic: "a", Payload: []byte("x")}))
	if !errors.Is(err, amqpsender.ErrNotConnected) || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("missing exchange: %v", err)
	}
	closeSender(t, s)

	// A routing key above 255 bytes is refused for good.
	s = amqpsender.New(amqpsender.Config{URL: node.URL(), Exchange: "mqtt"})
	err = sendertest.Result(t, sendertest.Send(s, &sender.Message{Topic: strings.Repeat("a/", 200), SourceTopic: "a", Payload: []byte("x")}))
	if !sender.IsPermanent(err) {
		t.Fatalf("long routing key: %v, want a permanent failure", err)
	}
	closeSender(t, s)
}

// TestBrokerRestartLosesNothingAccepted streams messages through the
// sender, with a retry of whatever is not accepted as the route does, and
// restarts the broker in the middle: gracefully (stop) and by a crash
// (SIGKILL of the node). Every message the sender reported accepted must
// be in the queue afterwards.
func TestBrokerRestartLosesNothingAccepted(t *testing.T) {
	for _, mode := range []string{"stop", "kill"} {
		t.Run(mode, func(t *testing.T) { restartStream(t, mode) })
	}
}

func restartStream(t *testing.T, mode string) {
	// Paced at about 1,000 msg/s, so that the stream outlasts a graceful
	// stop (the node drains before it closes the connection).
	const total, inFlight = 8000, 256
	node := amqptest.Start(t)
	topology(t, node.URL(), "mqtt", "stream", "s.#")
	s := amqpsender.New(amqpsender.Config{URL: node.URL(), Exchange: "mqtt", Mandatory: true, Timeout: 10 * time.Second})

	var (
		mu        sync.Mutex
		accepted  = make([]bool, total)
		nAccepted atomic.Int64
		attempts  atomic.Int64
		failures  atomic.Int64
		wg        sync.WaitGroup
		stopping  atomic.Bool
		slots     = make(chan struct{}, inFlight)
		allDone   = make(chan struct{})
	)
	var send func(id int)
	send = func(id int) {
		attempts.Add(1)
		m := &sender.Message{Topic: "s/" + strconv.Itoa(id%8), SourceTopic: "s", Payload: []byte(strconv.Itoa(id)), Received: time.Now(), Fence: fence.New(7, "b/s")}
		s.Send(m, func(err error) {
			if err != nil {
				failures.Add(1)
				if stopping.Load() {
					wg.Done()
					<-slots
					return
				}
				// As the route: retry after a backoff.
				time.AfterFunc(50*time.Millisecond, func() { send(id) })
				return
			}
			mu.Lock()
			accepted[id] = true
			mu.Unlock()
			if nAccepted.Add(1) == total {
				close(allDone)
			}
			wg.Done()
			<-slots
		})
	}
	go func() {
		for id := range total {
			time.Sleep(time.Millisecond)
			slots <- struct{}{}
			wg.Add(1)
			send(id)
		}
	}()

	if !sendertest.Eventually(time.Minute, func() bool { return nAccepted.Load() >= total/4 }) {
		t.Fatalf("only %d of %d accepted before the restart", nAccepted.Load(), total)
	}
	atRestart := nAccepted.Load()
	if mode == "kill" {
		node.Kill()
	} else {
		node.Stop()
	}
	afterDown := nAccepted.Load()
	node.Start()
	select {
	case <-allDone:
	case <-time.After(3 * time.Minute):
		t.Errorf("only %d of %d accepted 3 minutes after the restart", nAccepted.Load(), total)
	}
	stopping.Store(true)
	closeSender(t, s)
	wg.Wait()

	got := drain(t, node.URL(), "stream")
	seen := make([]int, total)
	for _, d := range got {
		id, err := strconv.Atoi(string(d.Body))
		if err != nil || id < 0 || id >= total {
			t.Fatalf("unexpected body %q", d.Body)
		}
		seen[id]++
	}
	lost, dups := 0, 0
	mu.Lock()
	for id := range total {
		if accepted[id] && seen[id] == 0 {
			lost++
		}
		if seen[id] > 1 {
			dups += seen[id] - 1
		}
	}
	mu.Unlock()
	t.Logf("restart (%s) after %d accepted (%d when the node was down): %d messages, %d publish attempts, %d accepted, %d attempts not accepted (retried), %d in the queue (%d duplicates), %d accepted and lost",
		mode, atRestart, afterDown, total, attempts.Load(), nAccepted.Load(), failures.Load(), len(got), dups, lost)
	if afterDown >= total || failures.Load() == 0 {
		t.Fatalf("the restart did not hit the stream (%d accepted when the node was down, %d failures)", afterDown, failures.Load())
	}
	if lost > 0 {
		t.Fatalf("%d accepted messages are not in the queue", lost)
	}
	if nAccepted.Load() != total {
		t.Fatalf("%d of %d accepted", nAccepted.Load(), total)
	}
}

func TestCloseFailsWhatTheBrokerNeverTook(t *testing.T) {
	// No broker: Send fails fast (not an unbounded wait), Close returns.
	s := amqpsender.New(amqpsender.Config{URL: "amqp://guest:guest@127.0.0.1:1/", Timeout: time.Second})
	err := sendertest.Result(t, sendertest.Send(s, &sender.Message{Topic: "a", SourceTopic: "a"}))
	if !errors.Is(err, amqpsender.ErrNotConnected) && !errors.Is(err, sender.ErrClosed) {
		t.Fatalf("no broker: %v", err)
	}
	closeSender(t, s)
	if err := sendertest.Result(t, sendertest.Send(s, &sender.Message{Topic: "a"})); !errors.Is(err, sender.ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
}

// BenchmarkPublishConfirmed measures accepted messages per second through
// one sender to a durable queue, 1,000 in flight as a route holds them.
func BenchmarkPublishConfirmed(b *testing.B) {
	node := amqptest.Start(b)
	conn, err := amqpgo.Dial(node.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if _, err := ch.QueueDeclare("bench", true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	s := amqpsender.New(amqpsender.Config{URL: node.URL(), RoutingKey: routingkey.MustParse("bench"), Mandatory: true})
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	}()
	payload := make([]byte, 200)
	slots := make(chan struct{}, 1000)
	var failed atomic.Int64
	b.ResetTimer()
	for range b.N {
		slots <- struct{}{}
		s.Send(&sender.Message{Topic: "t", SourceTopic: "t", Payload: payload, Fence: fence.New(1, "b/s")}, func(err error) {
			if err != nil {
				failed.Add(1)
			}
			<-slots
		})
	}
	for range cap(slots) {
		slots <- struct{}{}
	}
	b.StopTimer()
	if failed.Load() > 0 {
		b.Fatalf("%d not accepted", failed.Load())
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
}
