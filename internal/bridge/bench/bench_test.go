// Package bench measures the bridge MQTT → MQTT at QoS 1 with 256-byte
// payloads on loopback, against the same broker with the publisher's
// subscriber connected directly (the ceiling). The brokers are mosquitto
// processes (see broker):
//
//	go test -run '^$' -bench . -benchtime 1x ./internal/bridge/bench/
//
// Each benchmark reports msgs/s at up to 1,000 messages in flight, p50 and
// p99 latency at a paced 5,000 msg/s, and out-of-order deliveries.
// BenchmarkMemoryPer10kInFlight reports the bridge's heap for 10,000
// messages held in one route.
package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	mqttsender "github.com/myriarch/myriarch/internal/bridge/sender/mqtt"
	"github.com/myriarch/myriarch/internal/bridge/transport/mqtt"
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
	lastSeq  uint64
	outOfOrd int
	got      atomic.Int64
}

func (c *collector) on(p *paho.Publish) {
	now := time.Now().UnixNano()
	sent := int64(binary.BigEndian.Uint64(p.Payload[0:8]))
	seq := binary.BigEndian.Uint64(p.Payload[8:16])
	c.mu.Lock()
	c.lat = append(c.lat, time.Duration(now-sent))
	if seq < c.lastSeq {
		c.outOfOrd++
	}
	c.lastSeq = seq
	c.mu.Unlock()
	c.got.Add(1)
}

func (c *collector) reset() {
	c.mu.Lock()
	c.lat, c.lastSeq, c.outOfOrd = c.lat[:0], 0, 0
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
// window in flight, paced at rate (0: as fast as possible).
func publish(b *testing.B, pub *mqttsender.Sender, topic string, n, rate int) {
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
		pub.Send(&sender.Message{Topic: topic, Payload: p, QoS: 1}, func(err error) {
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

// run measures one path: publisher on pubURL topic "in/x", subscriber on
// subURL filter.
func run(b *testing.B, pubURL, subURL, subFilter string) {
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

	// Warm-up.
	publish(b, pub, "in/x", 2000, 0)
	waitCount(b, c, 2000)
	c.reset()

	b.ResetTimer()
	start := time.Now()
	publish(b, pub, "in/x", throughputN, 0)
	waitCount(b, c, throughputN)
	el := time.Since(start)
	b.ReportMetric(float64(throughputN)/el.Seconds(), "msgs/s")
	b.ReportMetric(float64(c.outOfOrd), "out-of-order")
	c.reset()

	publish(b, pub, "in/x", pacedN, pacedRate)
	waitCount(b, c, pacedN)
	b.ReportMetric(float64(c.percentile(0.50).Microseconds())/1000, "p50-ms@5k/s")
	b.ReportMetric(float64(c.percentile(0.99).Microseconds())/1000, "p99-ms@5k/s")
	b.ReportMetric(float64(c.outOfOrd), "paced-out-of-order")
}

func BenchmarkDirect(b *testing.B) {
	a := broker(b)
	for range b.N {
		run(b, a, a, "in/#")
	}
}

func BenchmarkBridge(b *testing.B) {
	a, dst := broker(b), broker(b)
	ctx := context.Background()
	out := mqttsender.New(mqttsender.Config{Broker: dst, ClientID: "bridge-out", QoS: 1, KeepAlive: 30 * time.Second})
	defer out.Close(ctx)
	route := routing.NewRoute(routing.RouteConfig{ID: "r", Filters: []string{"in/#"}, MaxInFlight: window,
		StripPrefix: "in/", AddPrefix: "out/", Targets: []routing.Target{{ID: "dst", Sender: out, MaxAttempts: 3}}})
	defer route.Close()
	d := &routing.Dispatcher{Session: "s", Routes: []*routing.Route{route}}
	s, err := mqtt.New(mqtt.Config{Brokers: []string{a}, ClientID: "bridge-in", SessionExpiry: time.Hour, KeepAlive: 30 * time.Second,
		ConnectTimeout: 5 * time.Second, ReconcileTimeout: 5 * time.Second, UnmatchedGrace: time.Second, ReceiveMaximum: window,
		Subscriptions: []mqtt.Subscription{{Filter: "in/#", QoS: 1}}, Handler: d.Handle})
	if err != nil {
		b.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(sctx) }()
	defer func() { cancel(); <-done }()
	for s.Level() != mqtt.LevelFull {
		time.Sleep(5 * time.Millisecond)
	}
	for range b.N {
		run(b, a, dst, "out/#")
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
			d.Handle(&mqtt.Message{Topic: fmt.Sprintf("plant/%d/telemetry", i%100), Payload: p, QoS: 1, Received: time.Now()}, func() {})
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
