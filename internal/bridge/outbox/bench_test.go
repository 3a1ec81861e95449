package outbox

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/myriarch/myriarch/internal/bridge/transport"
)

// BenchmarkAppendAck is the outbox's cost per message on a real
// PostgreSQL (pgtest: loopback, fsync off, synchronous_commit on): one
// fenced INSERT committed per Append (the durability point, awaited like
// the route's handler awaits it), the pump's claim of the row, and its
// share of the batched, fenced DELETE. Messages of 256 bytes, one
// appender, the reader concurrent as in a route. It reports msg/s and
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
