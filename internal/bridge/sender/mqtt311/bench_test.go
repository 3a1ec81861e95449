package mqtt311_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	mqttsender "github.com/myriarch/myriarch/internal/bridge/sender/mqtt"
	"github.com/myriarch/myriarch/internal/bridge/sender/mqtt311"
)

// BenchmarkSenderQoS1 publishes b.N 256-byte messages at QoS 1 to
// mosquitto (in-flight and queue limits raised) through the 3.1.1 sender,
// and through the MQTT 5 sender as the anchor of the same run, and
// reports msg/s until the last PUBACK.
//
//	go test -run '^$' -bench SenderQoS1 -benchtime 50000x ./internal/bridge/sender/mqtt311/
func BenchmarkSenderQoS1(b *testing.B) {
	m := embroker.TestMosquitto(b, "")
	payload := make([]byte, 256)
	for _, c := range []struct {
		name string
		open func() sender.Sender
	}{
		{"mqtt311", func() sender.Sender {
			return mqtt311.New(mqtt311.Config{Broker: "tcp://" + m.Addr, ClientID: "bench311", QoS: 1, KeepAlive: 30 * time.Second})
		}},
		{"mqtt5", func() sender.Sender {
			return mqttsender.New(mqttsender.Config{Broker: "tcp://" + m.Addr, ClientID: "bench5", QoS: 1, KeepAlive: 30 * time.Second})
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := c.open()
			defer func() { _ = s.Close(b.Context()) }()
			// Connected and warm: one message through first.
			warm := make(chan error, 1)
			s.Send(&sender.Message{Topic: "bench/warm", Payload: payload}, func(err error) { warm <- err })
			if err := <-warm; err != nil {
				b.Fatal(err)
			}
			done := make(chan error, 1024)
			b.ResetTimer()
			start := time.Now()
			go func() {
				for i := range b.N {
					s.Send(&sender.Message{Topic: fmt.Sprintf("bench/%d", i%8), Payload: payload}, func(err error) { done <- err })
				}
			}()
			for range b.N {
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
		})
	}
}
