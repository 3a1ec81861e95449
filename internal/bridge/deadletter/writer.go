package deadletter

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"sync"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/sender"
)

// FileMode is the mode the writer creates the dead-letter file with:
// payloads are the users' data.
const FileMode = 0o640

// Writer appends records to the dead-letter file. The routes share one.
type Writer struct {
	mu   sync.Mutex
	path string
	f    *os.File
}

// Open returns the writer of the file at path; the file is created (mode
// FileMode) with the first record.
func Open(path string) *Writer { return &Writer{path: path} }

// Path is the file's path.
func (w *Writer) Path() string { return w.path }

// Write appends the record of m (see NewRecord) with a fresh id and the
// current time, and syncs the file; a nil Writer refuses.
func (w *Writer) Write(route, senderID string, m *sender.Message, reason string, attempts int) error {
	if w == nil {
		return errors.New("no dead-letter file configured")
	}
	r := NewRecord(route, senderID, m, reason, attempts)
	r.Time = time.Now().UTC()
	r.ID = NewID()
	return w.Append(&r)
}

// Append writes r as one line and syncs the file.
func (w *Writer) Append(r *Record) error {
	if w == nil {
		return errors.New("no dead-letter file configured")
	}
	b, err := Encode(r)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		f, err := openAppend(w.path, FileMode)
		if err != nil {
			return err
		}
		w.f = f
	}
	if _, err := w.f.Write(append(b, '\n')); err != nil {
		return err
	}
	return w.f.Sync()
}

// openAppend opens path for appending, creating it with mode, and ends a
// torn last line (a crash in the middle of a write) so that the next line
// starts on a line of its own.
func openAppend(path string, mode os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_APPEND, mode)
	if err != nil {
		return nil, err
	}
	if err := sealTorn(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// sealTorn ends the file's last line if a crash left it without its
// newline. f is open for reading and appending.
func sealTorn(f *os.File) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() == 0 {
		return nil
	}
	last := make([]byte, 1)
	if _, err := f.ReadAt(last, st.Size()-1); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if last[0] != '\n' {
		if _, err := f.Write([]byte{'\n'}); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the file; the next Write opens it again.
func (w *Writer) Close() error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}

// NewID is a fresh record id: IDLen random hexadecimal digits.
func NewID() string {
	b := make([]byte, IDLen/2)
	_, _ = rand.Read(b) // crypto/rand.Read does not fail (Go 1.24+)
	return hex.EncodeToString(b)
}
