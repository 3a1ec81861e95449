package spool

import (
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/transport"
)

// BenchmarkSpool is the spool's own throughput: append a 200-byte
// message, hand it out, settle it, per fsync policy. Rerun on a quiet
// machine: go test -run '^$' -bench Spool ./internal/bridge/spool/
func BenchmarkSpool(b *testing.B) {
	for _, fs := range []string{FsyncNever, FsyncInterval, FsyncAlways} {
		b.Run("fsync="+fs, func(b *testing.B) {
			s, err := Open(b.Context(), Options{Dir: b.TempDir(), Fsync: fs, FsyncInterval: 200 * time.Millisecond})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			s.Attach(nil)
			m := &transport.Message{Topic: "plant/line1/telemetry", Payload: make([]byte, 200), QoS: 1, Received: time.Now()}
			b.SetBytes(int64(len(m.Payload)))
			b.ResetTimer()
			for range b.N {
				if err := s.Append(m, nil); err != nil {
					b.Fatal(err)
				}
				r, ok, err := s.NextRecord(nil)
				if !ok || err != nil {
					b.Fatal(ok, err)
				}
				s.Ack(r.Seq)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
		})
	}
}
