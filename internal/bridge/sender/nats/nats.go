// Package nats is the bridge's NATS sender: it publishes each message on a
// subject derived from its topic ('/' becomes '.') and counts a batch
// accepted once a flush round trip confirmed the server received it. A
// payload above the server's max_payload, or a subject NATS refuses, is a
// permanent failure: the route dead-letters the message without retrying.
package nats

import (
	"context"
	"errors"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/sender"
)

// Config configures the sender.
type Config struct {
	URL           string
	SubjectPrefix string
	Timeout       time.Duration
	Name          string
}

// DefaultTimeout bounds the connect and each flush when Config.Timeout is
// not positive.
const DefaultTimeout = 10 * time.Second

// Sender publishes to NATS.
type Sender struct {
	*sender.Batch
	nc *natsgo.Conn
}

// Dial connects to the server.
func Dial(cfg Config) (*Sender, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	nc, err := natsgo.Connect(cfg.URL, natsgo.Name(cfg.Name), natsgo.Timeout(cfg.Timeout), natsgo.MaxReconnects(-1))
	if err != nil {
		return nil, err
	}
	s := &Sender{nc: nc}
	s.Batch = sender.NewBatch(1024, func(ctx context.Context, ms []*sender.Message) []error {
		errs := make([]error, len(ms))
		// A topic whose message could not be published gets none of its
		// later messages published in this batch: the route retries (or
		// dead-letters) that one first.
		var failed map[string]bool
		var check sender.TenureCheck // one publish-and-flush: one point of action
		for i, m := range ms {
			if failed[m.Topic] || check.Withdrawn(m) {
				errs[i] = sender.ErrWithdrawn
				continue
			}
			if err := publish(nc, Subject(cfg.SubjectPrefix, m.Topic), m); err != nil {
				if errors.Is(err, natsgo.ErrMaxPayload) || errors.Is(err, natsgo.ErrBadSubject) {
					err = sender.Permanent(err)
				}
				errs[i] = err
				if failed == nil {
					failed = map[string]bool{}
				}
				failed[m.Topic] = true
			}
		}
		fctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
		if err := nc.FlushWithContext(fctx); err != nil {
			for i := range errs {
				if errs[i] == nil {
					errs[i] = err
				}
			}
		}
		return errs
	})
	return s, nil
}

// publish publishes m, with the fencing stamp as headers when it has one.
func publish(nc *natsgo.Conn, subject string, m *sender.Message) error {
	if m.Fence.IsZero() {
		return nc.Publish(subject, m.Payload)
	}
	h := natsgo.Header{}
	h.Set(fence.HeaderLeaseVersion, m.Fence.Version())
	h.Set(fence.HeaderSessionID, m.Fence.SessionID)
	return nc.PublishMsg(&natsgo.Msg{Subject: subject, Data: m.Payload, Header: h})
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
