package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/transport"
)

// BenchmarkAppendAck is the outbox's cost per lone message on a real
// PostgreSQL (pgtest: loopback, fsync off, synchronous_commit on): each
// Append awaited before the next, so each is its own fenced INSERT (a
// group of one) through the committer, the pump's claim of the row, and
// its share of the batched, fenced DELETE. Messages of 256 bytes, one
// appender, the reader concurrent as in a route. The route does not
// await its appends (BenchmarkRouteIntake is its path). It reports msg/s and
// the mean Append latency (append_us). MYRIARCH_OUTBOX_FSYNC=on runs the
// server with fsync on; MYRIARCH_OUTBOX_SYNC_COMMIT=off shows what an
// asynchronous commit would buy.
func BenchmarkAppendAck(b *testing.B) {
	e := newEnv(b)
	if v := os.Getenv("MYRIARCH_OUTBOX_SYNC_COMMIT"); v != "" {
		// What synchronous_commit off would buy (not an option of the
		// bridge: an acknowledged message could be lost with the server).
		cfg, err := pgxpool.ParseConfig(e.dsn)
		if err != nil {
			b.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = v
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(pool.Close)
		e.pool = pool
	}
	tok := e.acquire(b, e.store(b, nil), "bench#1")
	o := e.open(b, tok, Options{})
	m := &transport.Message{Topic: "plant/line1/telemetry", Payload: make([]byte, 256), QoS: 1, Received: time.Now()}
	quit := make(chan struct{})
	read := make(chan int, 1)
	if !o.Attach(nil) {
		b.Fatal("attach")
	}
	go func() {
		n := 0
		for n < b.N {
			seq, _, ok, err := o.Next(quit)
			if err != nil || !ok {
				break
			}
			o.Ack(seq)
			n++
		}
		read <- n
	}()
	b.ResetTimer()
	start := time.Now()
	var appendTotal time.Duration
	for range b.N {
		t0 := time.Now()
		if err := o.Append(m, nil); err != nil {
			b.Fatal(err)
		}
		appendTotal += time.Since(t0)
	}
	select {
	case n := <-read:
		if n != b.N {
			b.Fatalf("read %d of %d", n, b.N)
		}
	case <-time.After(time.Minute):
		close(quit)
		b.Fatal("reader did not finish")
	}
	// The last batch of deletes, so that the figure includes them.
	if err := o.flush(context.Background()); err != nil {
		b.Fatal(err)
	}
	el := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/el.Seconds(), "msg/s")
	b.ReportMetric(float64(appendTotal.Microseconds())/float64(b.N), "append_us")
	if st := o.Stats(); st.Messages != 0 {
		b.Fatalf("left %d", st.Messages)
	}
}

// acceptAll is a sender that accepts every message at once: the intake
// benchmark measures the spool's hand-over, not a destination.
type acceptAll struct{}

func (acceptAll) Send(_ *sender.Message, done func(error)) { done(nil) }
func (acceptAll) Close(context.Context) error              { return nil }

// BenchmarkRouteIntake models a route on this backend as the transport
// drives it: one goroutine (the packet loop) hands each message to the
// session's dispatcher (routing.Dispatcher.Handle → the route → the
// outbox) and the source's acknowledgment (the ack callback) comes back
// whenever the outbox holds the message durably. The source admits at
// most window unacknowledged messages (the session's receive_maximum,
// 100 in the outage lab): the loop waits for a free one before it hands
// on the next message, as a broker stops sending at that bound. The
// route's pump delivers from the outbox to a sender that accepts at once
// and the rows are deleted as settled, concurrently, as in a route.
//
// "max" hands messages on as fast as the window allows: the route's
// intake. "rate=500" paces arrivals at 500 msg/s (the rate); its
// latency counts from each message's scheduled arrival, so a backend that
// falls behind shows the queueing delay, not just the commit. Reported:
// msg/s (acknowledged), ack_p50_ms and ack_p99_ms.
// MYRIARCH_OUTBOX_FSYNC=on runs the server with fsync on.
func BenchmarkRouteIntake(b *testing.B) {
	for _, bc := range []struct {
		name string
		rate int
	}{{"max", 0}, {"rate=500", 500}} {
		b.Run(bc.name, func(b *testing.B) { benchIntake(b, 100, bc.rate) })
	}
}

func benchIntake(b *testing.B, window, rate int) {
	e := newEnv(b)
	tok := e.acquire(b, e.store(b, nil), "bench#1")
	o := e.open(b, tok, Options{})
	r := routing.NewRoute(routing.RouteConfig{ID: "r1", Filters: []string{"#"}, MaxInFlight: 100, Spool: o,
		Targets: []routing.Target{{ID: "sink", Sender: acceptAll{}, MaxAttempts: 1}}, Logger: slog.New(slog.DiscardHandler)})
	d := &routing.Dispatcher{Session: "s", Routes: []*routing.Route{r}}
	payload := make([]byte, 256)
	slots := make(chan struct{}, window)
	lat := make([]time.Duration, b.N)
	var acked sync.WaitGroup
	acked.Add(b.N)
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		at := time.Now()
		if rate > 0 {
			at = start.Add(time.Duration(i) * time.Second / time.Duration(rate))
			if w := time.Until(at); w > 0 {
				time.Sleep(w)
			}
		}
		slots <- struct{}{}
		m := &transport.Message{Topic: fmt.Sprintf("plant/line%d/telemetry", i%4), Payload: payload, QoS: 1, Received: at}
		d.Handle(m, func() {
			lat[i] = time.Since(at)
			<-slots
			acked.Done()
		})
	}
	waited := make(chan struct{})
	go func() { acked.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(2 * time.Minute):
		b.Fatal("not every message was acknowledged")
	}
	el := time.Since(start)
	b.StopTimer()
	r.Close()
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/el.Seconds(), "msg/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "ack_p50_ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "ack_p99_ms")
}
