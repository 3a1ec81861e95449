package spool

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/transport"
)

// acceptAll is a sender that accepts every message at once.
type acceptAll struct{}

func (acceptAll) Send(_ *sender.Message, done func(error)) { done(nil) }
func (acceptAll) Close(context.Context) error              { return nil }

// BenchmarkRouteIntake is the file spool's twin of the outbox's
// benchmark of that name: one goroutine (the session's packet loop)
// hands messages to the dispatcher (→ the route → the spool) with at most
// 100 unacknowledged (the session's receive_maximum), the pump delivers
// to a sender that accepts at once, per fsync policy. Reported: msg/s
// acknowledged to the source, ack_p50_ms and ack_p99_ms.
func BenchmarkRouteIntake(b *testing.B) {
	for _, fs := range []string{FsyncInterval, FsyncAlways} {
		b.Run("fsync="+fs, func(b *testing.B) {
			s, err := Open(b.Context(), Options{Dir: b.TempDir(), Fsync: fs, FsyncInterval: 200 * time.Millisecond})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			r := routing.NewRoute(routing.RouteConfig{ID: "r1", Filters: []string{"#"}, MaxInFlight: 100, Spool: s,
				Targets: []routing.Target{{ID: "sink", Sender: acceptAll{}, MaxAttempts: 1}}, Logger: slog.New(slog.DiscardHandler)})
			defer r.Close()
			d := &routing.Dispatcher{Session: "s", Routes: []*routing.Route{r}}
			payload := make([]byte, 200)
			slots := make(chan struct{}, 100)
			lat := make([]time.Duration, b.N)
			var acked sync.WaitGroup
			acked.Add(b.N)
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				slots <- struct{}{}
				at := time.Now()
				m := &transport.Message{Topic: fmt.Sprintf("plant/line%d/telemetry", i%4), Payload: payload, QoS: 1, Received: at}
				d.Handle(m, func() {
					lat[i] = time.Since(at)
					<-slots
					acked.Done()
				})
			}
			acked.Wait()
			el := time.Since(start)
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(b.N)/el.Seconds(), "msg/s")
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "ack_p50_ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "ack_p99_ms")
		})
	}
}
