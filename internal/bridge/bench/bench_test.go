// Package bench measures the bridge MQTT → MQTT at QoS 1 with 256-byte
// payloads on loopback, against the same broker with the publisher's
// subscriber connected directly (the ceiling). The brokers are mosquitto
// processes (see broker):
//
//	go test -run '^$' -bench . -benchtime 1x ./internal/bridge/bench/
//
// Each benchmark reports msgs/s at up to 1,000 messages in flight, p50 and
// p99 latency at a paced 5,000 msg/s, and out-of-order deliveries.
// BenchmarkFence reports the same path plain and as a lease tenure runs it
// (point-of-action checks, fencing stamps), side by side.
// BenchmarkMemoryPer10kInFlight reports the bridge's heap for 10,000
// messages held in one route.
package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	mqttsender "github.com/myriarch/myriarch/internal/bridge/sender/mqtt"
	"github.com/myriarch/myriarch/internal/bridge/spool"
	"github.com/myriarch/myriarch/internal/bridge/transport"
	"github.com/myriarch/myriarch/internal/bridge/transport/mqtt"
	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/sqlitestore"
)

const (
	payloadSize = 256
	window      = 1000
	throughputN = 30000
	pacedRate   = 5000
	pacedN      = 15000
)

type collector struct {
	mu       sync.Mutex
	lat      []time.Duration
	lastSeq  map[string]uint64 // per topic: order is kept per topic
	outOfOrd int
	got      atomic.Int64
}

func (c *collector) on(p *paho.Publish) {
	now := time.Now().UnixNano()
	sent := int64(binary.BigEndian.Uint64(p.Payload[0:8]))
	seq := binary.BigEndian.Uint64(p.Payload[8:16])
	c.mu.Lock()
	c.lat = append(c.lat, time.Duration(now-sent))
	if c.lastSeq == nil {
		c.lastSeq = map[string]uint64{}
	}
	if seq < c.lastSeq[p.Topic] {
		c.outOfOrd++
	}
	c.lastSeq[p.Topic] = seq
	c.mu.Unlock()
	c.got.Add(1)
}

func (c *collector) reset() {
	c.mu.Lock()
	c.lat, c.outOfOrd = c.lat[:0], 0
	clear(c.lastSeq)
	c.mu.Unlock()
	c.got.Store(0)
}

func (c *collector) percentile(p float64) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.lat) == 0 {
		return 0
	}
	s := slices.Clone(c.lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// publish sends n messages through a pipelined QoS 1 publisher with at most
// window in flight, paced at rate (0: as fast as possible), to topics in
// turn.
func publish(b *testing.B, pub *mqttsender.Sender, topics []string, n, rate int) {
	sem := make(chan struct{}, window)
	var wg sync.WaitGroup
	var interval time.Duration
	if rate > 0 {
		interval = time.Second / time.Duration(rate)
	}
	start := time.Now()
	for i := range n {
		if interval > 0 {
			if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
				time.Sleep(d)
			}
		}
		sem <- struct{}{}
		p := make([]byte, payloadSize)
		binary.BigEndian.PutUint64(p[0:8], uint64(time.Now().UnixNano()))
		binary.BigEndian.PutUint64(p[8:16], uint64(i+1))
		wg.Add(1)
		pub.Send(&sender.Message{Topic: topics[i%len(topics)], Payload: p, QoS: 1}, func(err error) {
			if err != nil {
				b.Error(err)
			}
			<-sem
			wg.Done()
		})
	}
	wg.Wait()
}

func waitCount(b *testing.B, c *collector, n int) {
	deadline := time.Now().Add(60 * time.Second)
	for c.got.Load() < int64(n) {
		if time.Now().After(deadline) {
			b.Fatalf("received %d of %d", c.got.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// result is one measured path.
type result struct {
	rate, p50, p99 float64 // msgs/s; ms at the paced rate
	outOfOrder     int
	pacedOutOfOrd  int
}

// run measures one path and reports its figures.
func run(b *testing.B, pubURL, subURL, subFilter string) {
	r := measure(b, pubURL, subURL, subFilter)
	b.ReportMetric(r.rate, "msgs/s")
	b.ReportMetric(float64(r.outOfOrder), "out-of-order")
	b.ReportMetric(r.p50, "p50-ms@5k/s")
	b.ReportMetric(r.p99, "p99-ms@5k/s")
	b.ReportMetric(float64(r.pacedOutOfOrd), "paced-out-of-order")
}

// measure measures one path: publisher on pubURL topic "in/x", subscriber
// on subURL filter.
func measure(b *testing.B, pubURL, subURL, subFilter string) result {
	return measureWith(b, pubURL, subURL, subFilter, []string{"in/x"}, func() {}, func() {})
}

// measureWith is measure with hooks around the paced phase (CPU sampling).
// The publisher sends to topics in turn.
func measureWith(b *testing.B, pubURL, subURL, subFilter string, topics []string, beforePaced, afterPaced func()) result {
	ctx := context.Background()
	c := &collector{}
	sub, err := embroker.Connect(ctx, subURL, fmt.Sprintf("bench-sub-%d", time.Now().UnixNano()), true, c.on)
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	if err := sub.Subscribe(ctx, subFilter, 1); err != nil {
		b.Fatal(err)
	}
	pub := mqttsender.New(mqttsender.Config{Broker: pubURL, ClientID: fmt.Sprintf("bench-pub-%d", time.Now().UnixNano()), QoS: 1, KeepAlive: 30 * time.Second})
	defer pub.Close(ctx)

	// The path is ready once a probe crosses it (mosquitto's bridge
	// connects and subscribes in the background).
	deadline := time.Now().Add(30 * time.Second)
	for c.got.Load() < int64(len(topics)) {
		if time.Now().After(deadline) {
			b.Fatal("no message crossed the path within 30s")
		}
		publish(b, pub, topics, len(topics), 0)
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	c.reset()

	// Warm-up.
	publish(b, pub, topics, 2000, 0)
	waitCount(b, c, 2000)
	c.reset()

	b.ResetTimer()
	var r result
	start := time.Now()
	publish(b, pub, topics, throughputN, 0)
	waitCount(b, c, throughputN)
	el := time.Since(start)
	r.rate = float64(throughputN) / el.Seconds()
	r.outOfOrder = c.outOfOrd
	c.reset()

	beforePaced()
	publish(b, pub, topics, pacedN, pacedRate)
	waitCount(b, c, pacedN)
	afterPaced()
	r.p50 = float64(c.percentile(0.50).Microseconds()) / 1000
	r.p99 = float64(c.percentile(0.99).Microseconds()) / 1000
	r.pacedOutOfOrd = c.outOfOrd
	return r
}

func BenchmarkDirect(b *testing.B) {
	a := broker(b)
	for range b.N {
		run(b, a, a, "in/#")
	}
}

func BenchmarkBridge(b *testing.B) {
	a, dst := broker(b), broker(b)
	stop := startBridge(b, a, dst, "bridge", nil, fencing{})
	defer stop()
	for range b.N {
		run(b, a, dst, "out/#")
	}
}

// fencing is what of an exclusive session's tenure a measured path runs.
type fencing struct {
	checks bool // every point of action checks the tenure (Valid)
	stamps bool // every message carries the fencing stamp
}

// startBridge runs the bridge's receive → route → MQTT send path from
// broker a ("in/#") to dst ("out/#") under clientID, with what f asks of
// own's tenure (own may be nil when f asks for nothing).
func startBridge(b *testing.B, a, dst, clientID string, own *lease.Ownership, f fencing) (stop func()) {
	stop, err := startBridgeErr(a, dst, clientID, own, f, 1)
	if err != nil {
		b.Fatal(err)
	}
	return stop
}

// startBridgeErr is startBridge for the bridge's child process, with
// routes routes: route k has its own session (filter in/k/#, or in/# for a
// single route) and its own MQTT sender to dst.
func startBridgeErr(a, dst, clientID string, own *lease.Ownership, f fencing, routes int) (stop func(), err error) {
	return startBridgeSpool(a, dst, clientID, own, f, routes, "")
}

// startBridgeSpool is startBridgeErr with, unless spoolFsync is empty, a
// durable file spool on every route (in a temporary directory removed at
// stop) with that fsync policy: the dispatcher appends each message and
// acknowledges the source once the spool holds it, and the route
// delivers from the spool, as a route with `spool:` runs.
func startBridgeSpool(a, dst, clientID string, own *lease.Ownership, f fencing, routes int, spoolFsync string) (stop func(), err error) {
	ctx := context.Background()
	var stamp fence.Stamp
	var guard fence.Tenure
	if f.stamps {
		stamp = fence.New(uint64(own.Token().Version), "bench/s")
	}
	if f.checks {
		guard = own
	}
	var stops []func()
	stop = func() {
		for _, s := range slices.Backward(stops) {
			s()
		}
	}
	for k := range max(routes, 1) {
		filter, id := "in/#", clientID
		if routes > 1 {
			filter, id = fmt.Sprintf("in/%d/#", k), fmt.Sprintf("%s-%d", clientID, k)
		}
		var sp routing.Spool
		if spoolFsync != "" {
			dir, err := os.MkdirTemp("", "bench-spool-")
			if err != nil {
				stop()
				return nil, err
			}
			s, err := spool.Open(ctx, spool.Options{Dir: dir, MaxBytes: 1 << 30, Fsync: spoolFsync, FsyncInterval: spool.DefaultFsyncInterval})
			if err != nil {
				_ = os.RemoveAll(dir)
				stop()
				return nil, err
			}
			sp = s
			// Registered before the route's stop: it runs after it.
			stops = append(stops, func() { _ = s.Close(); _ = os.RemoveAll(dir) })
		}
		out := mqttsender.New(mqttsender.Config{Broker: dst, ClientID: id + "-out", QoS: 1, KeepAlive: 30 * time.Second})
		route := routing.NewRoute(routing.RouteConfig{ID: "r", Filters: []string{filter}, MaxInFlight: window,
			StripPrefix: "in/", AddPrefix: "out/", Targets: []routing.Target{{ID: "dst", Sender: out, MaxAttempts: 3}},
			Fence: stamp, Tenure: guard, Spool: sp})
		d := &routing.Dispatcher{Session: "s", Routes: []*routing.Route{route}}
		// No session expiry: a bridge that stopped leaves no session behind
		// to queue the next measurement's messages.
		s, err := mqtt.New(transport.Config{Brokers: []string{a}, ClientID: id + "-in", CleanStart: true, KeepAlive: 30 * time.Second,
			ConnectTimeout: 5 * time.Second, ReconcileTimeout: 5 * time.Second, UnmatchedGrace: time.Second, ReceiveMaximum: window,
			Subscriptions: []transport.Subscription{{Filter: filter, QoS: 1}}, Handler: d.Handle, Tenure: guard})
		if err != nil {
			route.Close()
			_ = out.Close(ctx)
			stop()
			return nil, err
		}
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = s.Run(sctx) }()
		stops = append(stops, func() {
			cancel()
			<-done
			route.Close()
			_ = out.Close(ctx)
		})
		for deadline := time.Now().Add(30 * time.Second); s.Level() != transport.LevelFull; {
			if time.Now().After(deadline) {
				stop()
				return nil, fmt.Errorf("the session did not reach full service within 30s")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return stop, nil
}

// routeTopics are the publisher's topics for a bridge with routes routes:
// one per route.
func routeTopics(routes int) []string {
	if routes <= 1 {
		return []string{"in/x"}
	}
	t := make([]string, routes)
	for k := range t {
		t[k] = fmt.Sprintf("in/%d/x", k)
	}
	return t
}

func numCPU() int { return runtime.NumCPU() }

// BenchmarkFence is the per-message cost of an exclusive session's
// point-of-action checks (Ownership.Valid, which reads CLOCK_BOOTTIME) and
// fencing stamps (two MQTT 5 user properties per PUBLISH), side by side in
// one run: the same MQTT → MQTT path measured plain (as a non-exclusive
// session runs), with the checks only, with the stamps only, and fenced
// (both, as a lease tenure runs, under a real lease manager on sqlite),
// in rotating order on the same two brokers so that all see the same
// machine. The checks-only and stamps-only variants exist only here, to
// tell the two costs apart. Figures are medians over b.N rounds.
//
//	go test -run '^$' -bench Fence -benchtime 7x ./internal/bridge/bench/
func BenchmarkFence(b *testing.B) {
	own := ownership(b)
	a, dst := broker(b), broker(b)
	variants := []struct {
		name string
		f    fencing
	}{{"plain", fencing{}}, {"checks", fencing{checks: true}}, {"stamps", fencing{stamps: true}}, {"fenced", fencing{true, true}}}
	results := make([][]result, len(variants))
	for i := range b.N {
		for k := range variants {
			v := (i + k) % len(variants)
			stop := startBridge(b, a, dst, fmt.Sprintf("bridge-%d-%s", i, variants[v].name), own, variants[v].f)
			results[v] = append(results[v], measure(b, a, dst, "out/#"))
			stop()
		}
	}
	med := func(rs []result, f func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	rate := func(r result) float64 { return r.rate }
	p99 := func(r result) float64 { return r.p99 }
	base := med(results[0], rate)
	for v, vr := range variants {
		b.ReportMetric(med(results[v], rate), vr.name+"-msgs/s")
		b.ReportMetric(med(results[v], p99), vr.name+"-p99-ms@5k/s")
		if v > 0 {
			b.ReportMetric(med(results[v], rate)/base, vr.name+"/plain-throughput")
		}
	}
	if !own.Valid() {
		b.Fatal("the tenure ended during the benchmark: the fenced path stopped acting")
	}
}

// ownership runs a lease manager on a sqlite store in a temporary
// directory and returns its tenure, valid for the benchmark's length.
func ownership(b *testing.B) *lease.Ownership {
	b.Helper()
	st, err := sqlitestore.Open(context.Background(), filepath.Join(b.TempDir(), "lease.db"), sqlitestore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	c, _, err := failover.ResolveCadence(failover.LeaseConfig{LeaseTTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	owned := make(chan *lease.Ownership, 1)
	m, err := lease.New(lease.Config{Store: st, Session: "bench/s", InstanceID: "bench", Cadence: c,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnOwner: func(o *lease.Ownership) {
			owned <- o
			<-o.Stopping()
		}})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done; _ = st.Close() })
	select {
	case o := <-owned:
		return o
	case <-time.After(30 * time.Second):
		b.Fatal("no lease")
		return nil
	}
}

// hold keeps every message and its callback: they stay in flight.
type hold struct {
	n    atomic.Int64
	mu   sync.Mutex
	kept []func(error)
	msgs []*sender.Message
}

func (h *hold) Send(m *sender.Message, done func(error)) {
	h.mu.Lock()
	h.kept = append(h.kept, done)
	h.msgs = append(h.msgs, m)
	h.mu.Unlock()
	h.n.Add(1)
}
func (h *hold) Close(context.Context) error { return nil }

// BenchmarkMemoryPer10kInFlight: the bridge's heap growth while one route
// holds 10,000 received 256-byte messages (message, route bookkeeping,
// the transport's copy of the payload).
func BenchmarkMemoryPer10kInFlight(b *testing.B) {
	const n = 10000
	for range b.N {
		h := &hold{kept: make([]func(error), 0, n), msgs: make([]*sender.Message, 0, n)}
		route := routing.NewRoute(routing.RouteConfig{ID: "r", Filters: []string{"#"}, MaxInFlight: n, Targets: []routing.Target{{ID: "h", Sender: h}}})
		d := &routing.Dispatcher{Routes: []*routing.Route{route}}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range n {
			p := make([]byte, payloadSize)
			d.Handle(&transport.Message{Topic: fmt.Sprintf("plant/%d/telemetry", i%100), Payload: p, QoS: 1, Received: time.Now()}, func() {})
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		grew := float64(after.HeapAlloc) - float64(before.HeapAlloc)
		b.ReportMetric(grew/(1<<20), "MiB/10k-in-flight")
		b.ReportMetric(grew/n, "B/msg")
		if h.n.Load() != n {
			b.Fatal("not all in flight")
		}
		runtime.KeepAlive(d)
		runtime.KeepAlive(h)
		route.Close()
	}
}
