// Package file is the bridge's file sender: it appends each message as one
// JSON line and counts it accepted once the batch it belongs to has been
// written to the file (and so to the operating system; the file is not
// synced, so a machine crash can lose what the last moments accepted).
//
// A batch either lands whole or not at all as far as readers of whole
// lines are concerned: when a write fails part-way (a full disk), the file
// is truncated back to its last complete line; if even that fails, the
// next write starts on a new line so that the torn one cannot swallow it.
// A file that ends in a torn line when it is opened (a crash mid-write) is
// handled the same way.
package file

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
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
	// LeaseVersion and SessionID are the fencing stamp of an exclusive
	// session (package fence); absent for a non-exclusive one.
	LeaseVersion uint64 `json:"lease_version,omitempty"`
	SessionID    string `json:"session_id,omitempty"`
}

// Sender appends JSON lines to one file.
type Sender struct {
	*sender.Batch
	f *os.File
}

// Open opens (creating, appending) path.
func Open(path string) (*Sender, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	size, torn, err := tail(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	s := &Sender{f: f}
	cw := &countingWriter{w: f}
	w := bufio.NewWriterSize(cw, 64<<10)
	enc := json.NewEncoder(w)
	s.Batch = sender.NewBatch(1024, func(_ context.Context, ms []*sender.Message) []error {
		fail := func(err error) []error {
			w.Reset(cw)
			// Drop what part of the batch reached the file.
			if cw.n > 0 {
				if terr := f.Truncate(size); terr != nil {
					torn = true
				}
			}
			cw.n = 0
			return []error{err}
		}
		cw.n = 0
		if st, err := f.Stat(); err == nil {
			size = st.Size() // the last complete line's end
		}
		if torn {
			if _, err := w.WriteString("\n"); err != nil {
				return fail(err)
			}
		}
		for _, m := range ms {
			if err := enc.Encode(Line{Time: m.Received, Route: m.Route, Topic: m.Topic, SourceTopic: m.SourceTopic, QoS: m.QoS, Retain: m.Retain, Payload: m.Payload,
				LeaseVersion: m.Fence.LeaseVersion, SessionID: m.Fence.SessionID}); err != nil {
				return fail(err)
			}
		}
		if err := w.Flush(); err != nil {
			return fail(err)
		}
		torn = false
		return nil
	})
	return s, nil
}

// tail returns the file's size and whether it ends in a line without its
// newline.
func tail(f *os.File) (int64, bool, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, false, err
	}
	if st.Size() == 0 || !st.Mode().IsRegular() {
		return st.Size(), false, nil
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, st.Size()-1); err != nil && err != io.EOF {
		return 0, false, err
	}
	return st.Size(), b[0] != '\n', nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Close stops the sender and closes the file.
func (s *Sender) Close(ctx context.Context) error {
	err := s.Batch.Close(ctx)
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	return err
}
