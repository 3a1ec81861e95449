package spool

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/testwait"
)

// verdicts records what Enqueue's stored reported, in order.
type verdicts struct {
	mu  sync.Mutex
	got []verdict
}

type verdict struct {
	i   int
	err error
}

func (v *verdicts) of(i int) func(error) {
	return func(err error) {
		v.mu.Lock()
		v.got = append(v.got, verdict{i, err})
		v.mu.Unlock()
	}
}

func (v *verdicts) snapshot() []verdict {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.got)
}

func (v *verdicts) wait(t *testing.T, n int) []verdict {
	t.Helper()
	testwait.Until(t, fmt.Sprintf("%d verdicts", n), 30*time.Second, func() bool { return len(v.snapshot()) >= n })
	return v.snapshot()
}

func enqueue(t *testing.T, s *Spool, i int, v *verdicts) {
	t.Helper()
	if err := s.Enqueue(msg(i), nil, v.of(i)); err != nil {
		t.Fatalf("enqueue %d: %v", i, err)
	}
}

// heldSync replaces the group sync's fsync with one that counts the
// syncs and waits while held (an fsync that takes as long as the test
// wants: a disk cannot be made slow on demand).
type heldSync struct {
	mu      sync.Mutex
	syncs   int
	hold    chan struct{}
	entered chan struct{}
}

func holdSyncs(s *Spool) *heldSync {
	h := &heldSync{hold: make(chan struct{}), entered: make(chan struct{}, 100)}
	s.syncFile = func(f *os.File) error {
		h.mu.Lock()
		h.syncs++
		hold := h.hold
		h.mu.Unlock()
		h.entered <- struct{}{}
		<-hold
		return f.Sync()
	}
	return h
}

func (h *heldSync) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.hold:
	default:
		close(h.hold)
	}
}

func (h *heldSync) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.syncs
}

// fsync always through Enqueue: records are written at once and reported
// stored only after a sync that covers them; what arrives during one
// sync is covered by the next, one sync for all of it; in order.
func TestGroupSyncAlways(t *testing.T) {
	s := open(t, t.TempDir(), Options{Fsync: FsyncAlways})
	defer s.Close()
	h := holdSyncs(s)
	v := &verdicts{}
	enqueue(t, s, 0, v)
	<-h.entered // the syncer is in its first fsync
	for i := 1; i < 100; i++ {
		enqueue(t, s, i, v) // returns: the packet loop does not wait for the disk
	}
	if got := v.snapshot(); len(got) != 0 {
		t.Fatalf("reported stored before any sync: %v", got)
	}
	h.release()
	got := v.wait(t, 100)
	for k, g := range got {
		if g.i != k || g.err != nil {
			t.Fatalf("verdict %d: message %d, %v", k, g.i, g.err)
		}
	}
	if n := h.count(); n != 2 {
		t.Fatalf("%d fsyncs for m0 and the 99 written during its sync, want 2", n)
	}
	s.Attach(nil)
	if got := payloads(t, s, 100, true); got[0] != "m0" || got[99] != "m99" || !slices.IsSortedFunc(got, func(a, b string) int {
		var x, y int
		fmt.Sscanf(a, "m%d", &x)
		fmt.Sscanf(b, "m%d", &y)
		return x - y
	}) {
		t.Fatalf("read back: %v", got)
	}
}

// Close syncs what Enqueue wrote and reports it stored; after it Enqueue
// refuses. A failed sync reports every record of its batch unstored and
// stops the spool, as Append's failed fsync does.
func TestGroupSyncCloseAndFailure(t *testing.T) {
	t.Run("close", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir, Options{Fsync: FsyncAlways})
		h := holdSyncs(s)
		v := &verdicts{}
		enqueue(t, s, 0, v)
		<-h.entered
		enqueue(t, s, 1, v)
		enqueue(t, s, 2, v)
		closed := make(chan error, 1)
		go func() { closed <- s.Close() }()
		testwait.Until(t, "Close started", 30*time.Second, func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.closing
		})
		if err := s.Enqueue(msg(3), nil, v.of(3)); !errors.Is(err, ErrClosed) {
			t.Fatalf("enqueue while closing: %v", err)
		}
		h.release()
		if err := <-closed; err != nil {
			t.Fatal(err)
		}
		got := v.wait(t, 3)
		for k, g := range got {
			if g.i != k || g.err != nil {
				t.Fatalf("verdict %d: message %d, %v", k, g.i, g.err)
			}
		}
		s2 := open(t, dir, Options{Fsync: FsyncAlways})
		defer s2.Close()
		if st := s2.Stats(); st.Recovered != 3 {
			t.Fatalf("reopened: %+v", st)
		}
	})
	t.Run("failure", func(t *testing.T) {
		s := open(t, t.TempDir(), Options{Fsync: FsyncAlways})
		defer s.Close()
		s.syncFile = func(*os.File) error { return errors.New("EIO") }
		v := &verdicts{}
		enqueue(t, s, 0, v)
		if got := v.wait(t, 1); got[0].err == nil {
			t.Fatal("a failed sync reported stored")
		}
		testwait.Until(t, "the spool stopped", 30*time.Second, func() bool {
			return errors.Is(s.Enqueue(msg(1), nil, v.of(1)), ErrClosed)
		})
	})
}

// The full policy in the group sync: a refusal (dead_letter) is reported
// in its place in the order, after the records written before it.
func TestGroupSyncFullDeadLetter(t *testing.T) {
	s := open(t, t.TempDir(), Options{Fsync: FsyncAlways, MaxMessages: 2, Full: FullDeadLetter})
	defer s.Close()
	h := holdSyncs(s)
	v := &verdicts{}
	enqueue(t, s, 0, v)
	<-h.entered
	enqueue(t, s, 1, v)
	enqueue(t, s, 2, v)
	h.release()
	got := v.wait(t, 3)
	if got[0].err != nil || got[1].err != nil || got[1].i != 1 || got[2].i != 2 || !errors.Is(got[2].err, ErrFull) {
		t.Fatalf("verdicts: %v (want m0, m1 stored, m2 ErrFull)", got)
	}
}

// With fsync interval or never a written record is as durable as it
// will be: stored is reported before Enqueue returns.
func TestEnqueueWithoutGroupSync(t *testing.T) {
	for _, fs := range []string{FsyncInterval, FsyncNever} {
		s := open(t, t.TempDir(), Options{Fsync: fs, MaxMessages: 1, Full: FullDeadLetter})
		v := &verdicts{}
		enqueue(t, s, 0, v)
		enqueue(t, s, 1, v)
		if got := v.snapshot(); len(got) != 2 || got[0].err != nil || !errors.Is(got[1].err, ErrFull) {
			t.Fatalf("fsync %s: %v", fs, got)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Enqueue(msg(2), nil, v.of(2)); !errors.Is(err, ErrClosed) {
			t.Fatalf("fsync %s: enqueue after close: %v", fs, err)
		}
	}
}
