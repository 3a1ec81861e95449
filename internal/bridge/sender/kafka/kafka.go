// Package kafka is the bridge's Kafka sender, on franz-go. Each message is
// produced with its MQTT topic as the record key, so that one topic's
// messages share a partition and keep their order, and counts accepted
// when the broker acknowledged the record (acks=all, idempotent producer).
// Headers: mqtt_topic (the topic it arrived on) and mqtt_received (when
// the bridge received it, RFC 3339 UTC); the record timestamp is the
// time it was produced.
//
// Records are handed to the client by one goroutine of the sender, never
// by the caller of Send: franz-go calls its promises serially, and a
// Produce that blocks (the client's buffer is full) inside a promise
// deadlocks the client — and the route sends the next messages of a topic
// from the previous one's completion.
package kafka

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/sender"
)

// Config configures the sender.
type Config struct {
	Brokers []string
	Topic   string
	// Timeout bounds each record's delivery, retries inside the client
	// included (RecordDeliveryTimeout).
	Timeout time.Duration
}

type item struct {
	m    *sender.Message
	done func(error)
}

// Sender produces to Kafka.
type Sender struct {
	cl    *kgo.Client
	topic string

	mu     sync.Mutex
	queue  []item
	closed bool
	kick   chan struct{}
	stop   chan struct{}
	exited chan struct{}
	ctx    context.Context // ends when Close gives up waiting
	cancel context.CancelFunc
}

// Dial creates the client; franz-go connects lazily.
func Dial(cfg Config) (*Sender, error) {
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.DefaultProduceTopic(cfg.Topic),
		kgo.ProducerLinger(0),
		kgo.RequiredAcks(kgo.AllISRAcks()),
	}
	if cfg.Timeout > 0 {
		opts = append(opts, kgo.RecordDeliveryTimeout(cfg.Timeout))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	s := &Sender{cl: cl, topic: cfg.Topic, kick: make(chan struct{}, 1), stop: make(chan struct{}), exited: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	go s.run()
	return s, nil
}

// Send queues m; the sender's goroutine produces it.
func (s *Sender) Send(m *sender.Message, done func(error)) {
	if !sender.Enqueue(&s.mu, &s.closed, &s.queue, item{m, done}, done) {
		return
	}
	sender.Wake(s.kick)
}

func (s *Sender) run() {
	defer close(s.exited)
	for {
		select {
		case <-s.kick:
		case <-s.stop:
		}
		s.mu.Lock()
		q := s.queue
		s.queue = nil
		closed := s.closed
		s.mu.Unlock()
		var check sender.TenureCheck
		for _, it := range q {
			if check.Withdrawn(it.m) {
				it.done(sender.ErrWithdrawn)
				continue
			}
			// The record's timestamp is now, not when the bridge received
			// the message: franz-go measures the delivery timeout from it,
			// so an older timestamp would time a retried or long-queued
			// message out before it is ever produced.
			headers := []kgo.RecordHeader{{Key: "mqtt_topic", Value: []byte(it.m.SourceTopic)}}
			if !it.m.Received.IsZero() {
				headers = append(headers, kgo.RecordHeader{Key: "mqtt_received", Value: []byte(it.m.Received.UTC().Format(time.RFC3339Nano))})
			}
			if f := it.m.Fence; !f.IsZero() {
				headers = append(headers, kgo.RecordHeader{Key: fence.HeaderLeaseVersion, Value: []byte(f.Version())},
					kgo.RecordHeader{Key: fence.HeaderSessionID, Value: []byte(f.SessionID)})
			}
			r := &kgo.Record{Topic: s.topic, Key: []byte(it.m.Topic), Value: it.m.Payload, Timestamp: time.Now(), Headers: headers}
			done := it.done
			// Produce blocks while the client's buffer is full; promises
			// keep running meanwhile, so that is backpressure, not deadlock.
			s.cl.Produce(s.ctx, r, func(_ *kgo.Record, err error) { done(Classify(err)) })
		}
		if closed {
			return
		}
	}
}

// Classify marks the errors that a retry of the same record cannot cure
// as permanent: a record too large for the client or the broker, or one
// the broker rejects as invalid.
func Classify(err error) error {
	if errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.InvalidRecord) || errors.Is(err, kerr.RecordListTooLarge) {
		return sender.Permanent(err)
	}
	return err
}

// Close produces what is queued, flushes within ctx and closes the client;
// records not acknowledged by then fail. Close is for the owner of the
// sender, once; Send after Close fails with sender.ErrClosed.
func (s *Sender) Close(ctx context.Context) error {
	s.mu.Lock()
	already := s.closed
	s.closed = true
	s.mu.Unlock()
	if already {
		<-s.exited
		return nil
	}
	defer s.cancel()
	close(s.stop)
	select {
	case <-s.exited:
	case <-ctx.Done():
		s.cancel() // fails what waits for buffer space
		<-s.exited
	}
	err := s.cl.Flush(ctx)
	s.cl.Close()
	return err
}
