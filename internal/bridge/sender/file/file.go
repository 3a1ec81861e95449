// Package file is the bridge's file sender: it appends each message as one
// JSON line and counts it accepted once the batch it belongs to has been
// written to the file (and so to the operating system).
package file

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/sender"
)

// Line is the JSON object written per message.
type Line struct {
	Time        time.Time `json:"time"`
	Route       string    `json:"route"`
	Topic       string    `json:"topic"`
	SourceTopic string    `json:"source_topic"`
	QoS         byte      `json:"qos"`
	Retain      bool      `json:"retain,omitempty"`
	Payload     []byte    `json:"payload"` // base64
}

// Sender appends JSON lines to one file.
type Sender struct {
	*sender.Batch
	f *os.File
}

// Open opens (creating, appending) path.
func Open(path string) (*Sender, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	s := &Sender{f: f}
	w := bufio.NewWriterSize(f, 64<<10)
	enc := json.NewEncoder(w)
	s.Batch = sender.NewBatch(1024, func(_ context.Context, ms []*sender.Message) []error {
		for _, m := range ms {
			if err := enc.Encode(Line{Time: m.Received, Route: m.Route, Topic: m.Topic, SourceTopic: m.SourceTopic, QoS: m.QoS, Retain: m.Retain, Payload: m.Payload}); err != nil {
				w.Reset(f)
				return []error{err}
			}
		}
		if err := w.Flush(); err != nil {
			w.Reset(f)
			return []error{err}
		}
		return nil
	})
	return s, nil
}

// Close stops the sender and closes the file.
func (s *Sender) Close(ctx context.Context) error {
	err := s.Batch.Close(ctx)
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	return err
}
