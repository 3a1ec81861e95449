package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	mqttsender "github.com/myriarch/myriarch/internal/bridge/sender/mqtt"
	"github.com/myriarch/myriarch/internal/bridge/spool"
	"github.com/myriarch/myriarch/internal/bridge/transport"
)

// spoolRow is one path of BenchmarkCompareSpool.
type spoolRow struct {
	name      string
	n         int
	rate      float64 // msgs/s through the path
	bridgeCPU float64 // µs of the bridging process per message
	outOfOrd  int
}

// BenchmarkCompareSpool is what the durable spool costs the bridge, side
// by side in one run on the same machine: mosquitto's own bridge (the
// anchor of BenchmarkCompare), myriarch-bridge on an ephemeral session
// without a spool, with a file spool at fsync interval and at fsync
// always (each message synced before the source is acknowledged: one
// fsync for every message written during the previous one), each moving
// as many QoS 1 messages as it can with up to 1,000 in flight; then
// the spool's own append → hand out → settle throughput per fsync policy,
// in this process. It prints the table with the ratios against the
// anchor and against the bridge without a spool.
//
//	make bench
func BenchmarkCompareSpool(b *testing.B) {
	mosquittoExe(b)
	for range b.N {
		load0 := loadavg()
		var rows []spoolRow
		a, _ := mosquitto(b, "")
		dst, dpid := mosquitto(b, mosquittoBridge(a))
		rows = append(rows, measureSpoolPath(b, "mosquitto's own bridge (inside broker B; the anchor)", a, dst, dpid, 20000))
		for _, k := range []struct {
			kind kind
			name string
			n    int
		}{
			{ephemeral, "myriarch-bridge, no spool", 20000},
			{ephemeralSpoolInterval, "myriarch-bridge, spool fsync interval", 20000},
			{ephemeralSpoolAlways, "myriarch-bridge, spool fsync always", 20000},
		} {
			a, _ = mosquitto(b, "")
			dst, _ = mosquitto(b, "")
			ch := bridgeProcess(b, a, dst, fmt.Sprintf("spool-%d", k.kind), k.kind, 1, "")
			rows = append(rows, measureSpoolPath(b, k.name, a, dst, ch.pid, k.n))
		}
		own := measureSpoolAlone(b)
		fmt.Printf("\nQoS 1, %d-byte payloads, up to %d in flight, loopback, mosquitto brokers; load average %.1f → %.1f on %d-core machine\n\n",
			payloadSize, window, load0, loadavg(), numCPU())
		fmt.Println("| path | messages | msg/s | vs mosquitto's bridge | vs no spool | bridge CPU per message | out of order |")
		fmt.Println("|---|---|---|---|---|---|---|")
		anchor, off := rows[0].rate, rows[1].rate
		for i, r := range rows {
			vsOff := "–"
			if i > 0 {
				vsOff = fmt.Sprintf("%.2f×", r.rate/off)
			}
			fmt.Printf("| %s | %d | %.0f | %.2f× | %s | %.1f µs | %d |\n", r.name, r.n, r.rate, r.rate/anchor, vsOff, r.bridgeCPU, r.outOfOrd)
		}
		fmt.Println()
		fmt.Println("| spool alone (append 256 B, hand out, settle; one goroutine) | msg/s |")
		fmt.Println("|---|---|")
		for _, o := range own {
			fmt.Printf("| fsync %s | %.0f |\n", o.fsync, o.rate)
		}
		fmt.Println()
		for _, r := range rows[1:] {
			if r.outOfOrd > 0 {
				b.Errorf("%s: %d messages out of order", r.name, r.outOfOrd)
			}
		}
		b.ReportMetric(rows[2].rate/off, "spool-interval-vs-no-spool")
		b.ReportMetric(rows[3].rate/off, "spool-always-vs-no-spool")
		b.ReportMetric(rows[2].rate/anchor, "spool-interval-vs-mosquitto-bridge")
		b.ReportMetric(rows[2].rate, "spool-interval-msgs/s")
		b.ReportMetric(rows[3].rate, "spool-always-msgs/s")
		for _, o := range own {
			b.ReportMetric(o.rate, "spool-alone-"+o.fsync+"-msgs/s")
		}
	}
}

// measureSpoolPath moves n messages (publisher on a "in/x", subscriber on
// dst "out/#") as fast as the path takes them, after a probe and a
// warm-up, and reports the rate and the CPU of process pid per message.
func measureSpoolPath(b *testing.B, name, a, dst string, pid, n int) spoolRow {
	ctx := context.Background()
	c := &collector{}
	sub, err := embroker.Connect(ctx, dst, fmt.Sprintf("bench-sub-%d", time.Now().UnixNano()), true, c.on)
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	if err := sub.Subscribe(ctx, "out/#", 1); err != nil {
		b.Fatal(err)
	}
	pub := mqttsender.New(mqttsender.Config{Broker: a, ClientID: fmt.Sprintf("bench-pub-%d", time.Now().UnixNano()), QoS: 1, KeepAlive: 30 * time.Second})
	defer pub.Close(ctx)
	topics := []string{"in/x"}
	for deadline := time.Now().Add(30 * time.Second); c.got.Load() < 1; {
		if time.Now().After(deadline) {
			b.Fatalf("%s: no message crossed the path within 30s", name)
		}
		publish(b, pub, topics, 1, 0)
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	c.reset()
	warm := min(n/10, 1000)
	publish(b, pub, topics, warm, 0)
	waitCountFor(b, c, warm, 2*time.Minute)
	c.reset()
	cpu0 := cpuTime(pid)
	start := time.Now()
	publish(b, pub, topics, n, 0)
	waitCountFor(b, c, n, 5*time.Minute)
	el := time.Since(start)
	r := spoolRow{name: name, n: n, rate: float64(n) / el.Seconds(), outOfOrd: c.outOfOrd}
	if pid != 0 {
		r.bridgeCPU = float64((cpuTime(pid) - cpu0).Microseconds()) / float64(n)
	}
	return r
}

// waitCountFor is waitCount with a limit of its own (a spool with fsync
// always is bound by the disk's sync latency, on a slow disk to a few
// thousand messages per second even with one fsync per group).
func waitCountFor(b *testing.B, c *collector, n int, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for c.got.Load() < int64(n) {
		if time.Now().After(deadline) {
			b.Fatalf("received %d of %d within %v", c.got.Load(), n, limit)
		}
		time.Sleep(time.Millisecond)
	}
}

type spoolAlone struct {
	fsync string
	rate  float64
}

// measureSpoolAlone is the spool's own throughput per fsync policy: for
// about a second each (at least 200 messages), append a 256-byte message,
// hand it out and settle it, one goroutine, in a temporary directory.
func measureSpoolAlone(b *testing.B) []spoolAlone {
	var out []spoolAlone
	for _, fs := range []string{spool.FsyncNever, spool.FsyncInterval, spool.FsyncAlways} {
		s, err := spool.Open(b.Context(), spool.Options{Dir: b.TempDir(), MaxBytes: 1 << 30, Fsync: fs, FsyncInterval: spool.DefaultFsyncInterval})
		if err != nil {
			b.Fatal(err)
		}
		s.Attach(nil)
		m := &transport.Message{Topic: "plant/line1/telemetry", Payload: make([]byte, payloadSize), QoS: 1, Received: time.Now()}
		n, start := 0, time.Now()
		for n < 200 || time.Since(start) < time.Second {
			if err := s.Append(m, nil); err != nil {
				b.Fatal(err)
			}
			r, ok, err := s.NextRecord(nil)
			if !ok || err != nil {
				b.Fatal(ok, err)
			}
			s.Ack(r.Seq)
			n++
		}
		out = append(out, spoolAlone{fsync: fs, rate: float64(n) / time.Since(start).Seconds()})
		s.Detach()
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
	return out
}
