// Package nats is the bridge's NATS sender: it publishes each message on a
// subject derived from its topic ('/' becomes '.') and counts a batch
// accepted once a flush round trip confirmed the server received it.
package nats

import (
	"context"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/myriarch/myriarch/internal/bridge/sender"
)

// Config configures the sender.
type Config struct {
	URL           string
	SubjectPrefix string
	Timeout       time.Duration
	Name          string
}

// Sender publishes to NATS.
type Sender struct {
	*sender.Batch
	nc *natsgo.Conn
}

// Dial connects to the server.
func Dial(cfg Config) (*Sender, error) {
	nc, err := natsgo.Connect(cfg.URL, natsgo.Name(cfg.Name), natsgo.Timeout(cfg.Timeout), natsgo.MaxReconnects(-1))
	if err != nil {
		return nil, err
	}
	s := &Sender{nc: nc}
	s.Batch = sender.NewBatch(1024, func(ctx context.Context, ms []*sender.Message) []error {
		for _, m := range ms {
			if err := nc.Publish(Subject(cfg.SubjectPrefix, m.Topic), m.Payload); err != nil {
				return []error{err}
			}
		}
		fctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
		if err := nc.FlushWithContext(fctx); err != nil {
			return []error{err}
		}
		return nil
	})
	return s, nil
}

// Subject maps an MQTT topic to a NATS subject.
func Subject(prefix, topic string) string {
	s := strings.NewReplacer("/", ".", " ", "_", "*", "_", ">", "_").Replace(strings.Trim(topic, "/"))
	if prefix != "" {
		s = strings.TrimSuffix(prefix, ".") + "." + s
	}
	return s
}

// Close stops the sender and closes the connection.
func (s *Sender) Close(ctx context.Context) error {
	err := s.Batch.Close(ctx)
	s.nc.Close()
	return err
}
