// Package kafka is the bridge's Kafka sender, on franz-go. Each message is
// produced with its MQTT topic as the record key, so that one topic's
// messages share a partition and keep their order, and counts accepted
// when the broker acknowledged the record (acks=all, idempotent producer).
package kafka

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/myriarch/myriarch/internal/bridge/sender"
)

// Config configures the sender.
type Config struct {
	Brokers []string
	Topic   string
	Timeout time.Duration
}

// Sender produces to Kafka.
type Sender struct {
	cl    *kgo.Client
	topic string
}

// Dial creates the client; franz-go connects lazily.
func Dial(cfg Config) (*Sender, error) {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.DefaultProduceTopic(cfg.Topic),
		kgo.RecordDeliveryTimeout(cfg.Timeout),
		kgo.ProducerLinger(0),
		kgo.RequiredAcks(kgo.AllISRAcks()),
	)
	if err != nil {
		return nil, err
	}
	return &Sender{cl: cl, topic: cfg.Topic}, nil
}

// Send produces m asynchronously.
func (s *Sender) Send(m *sender.Message, done func(error)) {
	r := &kgo.Record{Topic: s.topic, Key: []byte(m.Topic), Value: m.Payload, Timestamp: m.Received,
		Headers: []kgo.RecordHeader{{Key: "mqtt_topic", Value: []byte(m.SourceTopic)}}}
	s.cl.Produce(context.Background(), r, func(_ *kgo.Record, err error) { done(err) })
}

// Close flushes within ctx and closes the client; unflushed records fail.
func (s *Sender) Close(ctx context.Context) error {
	err := s.cl.Flush(ctx)
	s.cl.Close()
	return err
}
