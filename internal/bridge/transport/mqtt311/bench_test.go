package mqtt311

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/transport"
	"github.com/myriarch/myriarch/internal/bridge/transport/mqtt"
)

// BenchmarkReceiveQoS1 has a 3.1.1 publisher put b.N 256-byte messages at
// QoS 1 into mosquitto (in-flight and queue limits raised, up to 1,000
// unacknowledged publishes) while a session receives and acknowledges
// them: the MQTT 3.1.1 session, and the MQTT 5 session as the anchor of
// the same run. It reports msg/s until the last message was handed on.
//
//	go test -run '^$' -bench ReceiveQoS1 -benchtime 50000x ./internal/bridge/transport/mqtt311/
func BenchmarkReceiveQoS1(b *testing.B) {
	m := embroker.TestMosquitto(b, "")
	url := "tcp://" + m.Addr
	type runner interface {
		Run(context.Context) error
		Level() transport.Level
	}
	for _, c := range []struct {
		name string
		open func(transport.Config) (runner, error)
	}{
		{"mqtt311", func(cfg transport.Config) (runner, error) { return New(cfg) }},
		{"mqtt5", func(cfg transport.Config) (runner, error) { return mqtt.New(cfg) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			var got atomic.Int64
			cfg := testConfig(url, "bench-"+c.name, func(_ *transport.Message, ack func()) { got.Add(1); ack() })
			cfg.Subscriptions = []transport.Subscription{{Filter: "bench/#", QoS: 1}}
			s, err := c.open(cfg)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			ran := make(chan struct{})
			go func() { defer close(ran); _ = s.Run(ctx) }()
			defer func() { cancel(); <-ran }()
			deadline := time.Now().Add(30 * time.Second)
			for s.Level() != transport.LevelFull {
				if time.Now().After(deadline) {
					b.Fatal("session not full")
				}
				time.Sleep(5 * time.Millisecond)
			}
			pub := paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID("bench-pub-" + c.name).SetProtocolVersion(4).SetAutoReconnect(false))
			if tok := pub.Connect(); !tok.WaitTimeout(20*time.Second) || tok.Error() != nil {
				b.Fatal(tok.Error())
			}
			defer pub.Disconnect(250)
			payload := make([]byte, 256)
			b.ResetTimer()
			start := time.Now()
			window := make(chan paho.Token, 1000)
			go func() {
				defer close(window)
				for i := range b.N {
					window <- pub.Publish(fmt.Sprintf("bench/%d", i%8), 1, false, payload)
				}
			}()
			for tok := range window {
				if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
					b.Fatal(tok.Error())
				}
			}
			for got.Load() < int64(b.N) {
				if time.Since(start) > 5*time.Minute {
					b.Fatalf("received %d of %d", got.Load(), b.N)
				}
				time.Sleep(time.Millisecond)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
		})
	}
}
