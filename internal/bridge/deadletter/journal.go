package deadletter

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"syscall"
	"time"
)

// JournalSuffix names the replay journal next to the dead-letter file:
// <dead-letter file>.replay.jsonl.
const JournalSuffix = ".replay.jsonl"

// JournalPath is the replay journal of the dead-letter file at path.
func JournalPath(deadLetterPath string) string { return deadLetterPath + JournalSuffix }

// Outcomes of one replayed record.
const (
	// OutcomeSent: the destination accepted the message.
	OutcomeSent = "sent"
	// OutcomeFailed: the destination refused it or could not be reached.
	OutcomeFailed = "failed"
	// OutcomeUnknown: no verdict within the timeout; the message may or
	// may not have arrived. It counts as not replayed, so a later replay
	// sends it again (at least once).
	OutcomeUnknown = "unknown"
)

// JournalEntry is one line of the replay journal: what one replay did
// with one record.
type JournalEntry struct {
	Time time.Time `json:"time"`
	// Run identifies the replay command that wrote the entry.
	Run      string `json:"run"`
	RecordID string `json:"record_id"`
	// RecordLine is the record's line in the dead-letter file then.
	RecordLine int `json:"record_line"`
	// Via is "route" or "sender"; Route the route replayed through (via
	// route only); Sender the sender that delivered.
	Via     string `json:"via"`
	Route   string `json:"route,omitempty"`
	Sender  string `json:"sender"`
	Topic   string `json:"topic"`
	Bytes   int    `json:"bytes"`
	Outcome string `json:"outcome"`
	Error   string `json:"error,omitempty"`
}

// Journal is the append-only record of what was replayed. An open Journal
// holds an exclusive lock on its file, so that two replays of one
// dead-letter file cannot both send a record.
type Journal struct {
	mu   sync.Mutex
	f    *os.File
	sent map[string]JournalEntry
}

// ErrJournalLocked is returned by OpenJournal while another replay holds
// the journal.
var ErrJournalLocked = errors.New("another replay of this dead-letter file is running (its journal is locked)")

// OpenJournal opens (creating, mode FileMode) and locks the journal at
// path and reads what it holds. It refuses a path that is a symbolic link
// or not a regular file: a replay must not append to a file someone
// pointed it at. The problems are journal lines it could not read.
func OpenJournal(path string) (*Journal, []Problem, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_APPEND|syscall.O_NOFOLLOW, FileMode)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, nil, fmt.Errorf("replay journal %s: is a symbolic link; refusing to follow it", path)
		}
		return nil, nil, fmt.Errorf("replay journal: %w", err)
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		_ = f.Close()
		if err == nil {
			err = fmt.Errorf("replay journal %s: not a regular file (%s)", path, st.Mode().Type())
		}
		return nil, nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil, fmt.Errorf("%s: %w", path, ErrJournalLocked)
		}
		return nil, nil, fmt.Errorf("replay journal %s: lock: %w", path, err)
	}
	j := &Journal{f: f, sent: map[string]JournalEntry{}}
	problems, err := scanJournal(f, func(e JournalEntry) { j.note(e) })
	if err != nil {
		_ = f.Close()
		return nil, nil, fmt.Errorf("replay journal %s: %w", path, err)
	}
	// End a torn last line, as the dead-letter writer does.
	if err := sealTorn(f); err != nil {
		_ = f.Close()
		return nil, nil, fmt.Errorf("replay journal %s: %w", path, err)
	}
	return j, problems, nil
}

// ReadJournal reads the journal at path without locking it, for a dry
// run; a missing journal is empty.
func ReadJournal(path string) (*Journal, []Problem, error) {
	j := &Journal{sent: map[string]JournalEntry{}}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return j, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("replay journal: %w", err)
	}
	defer f.Close()
	problems, err := scanJournal(f, func(e JournalEntry) { j.note(e) })
	if err != nil {
		return nil, nil, fmt.Errorf("replay journal %s: %w", path, err)
	}
	return j, problems, nil
}

func scanJournal(f *os.File, fn func(JournalEntry)) ([]Problem, error) {
	return scanLines(f, 1<<20, func(line []byte, n int, off int64, last bool) (*Problem, error) {
		var e JournalEntry
		if err := json.Unmarshal(line, &e); err != nil || e.RecordID == "" {
			if err == nil {
				err = errors.New("record_id: missing")
			}
			return &Problem{Line: n, Offset: off, Torn: last, Err: err}, nil
		}
		fn(e)
		return nil, nil
	})
}

func (j *Journal) note(e JournalEntry) {
	if e.Outcome == OutcomeSent {
		j.sent[e.RecordID] = e
	}
}

// Replayed returns the entry that recorded the record's successful
// replay, if any.
func (j *Journal) Replayed(recordID string) (JournalEntry, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	e, ok := j.sent[recordID]
	return e, ok
}

// Append writes e as one line and syncs the journal.
func (j *Journal) Append(e JournalEntry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return errors.New("replay journal: read-only (dry run) or closed")
	}
	if _, err := j.f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("replay journal: %w", err)
	}
	if err := j.f.Sync(); err != nil {
		return fmt.Errorf("replay journal: %w", err)
	}
	j.note(e)
	return nil
}

// Close releases the journal and its lock.
func (j *Journal) Close() error {
	if j == nil {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	return err
}
