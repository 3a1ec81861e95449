package lastseen

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/store"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fakeWriter struct {
	mu     sync.Mutex
	fail   bool
	seen   []store.Seen
	events []store.Event
	calls  int
}

func (f *fakeWriter) FlushSeen(_ context.Context, b []store.Seen) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.fail {
		return 0, errors.New("db down")
	}
	f.seen = append(f.seen, b...)
	return int64(len(b)), nil
}

func (f *fakeWriter) InsertEvents(_ context.Context, e []store.Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return errors.New("db down")
	}
	f.events = append(f.events, e...)
	return nil
}

func TestManyTouchesOneWrite(t *testing.T) {
	w := &fakeWriter{}
	b := New(w, time.Hour, nil, nil)
	t0 := time.Unix(1000, 0)
	for i := range 1000 {
		b.Touch("a", "c1", t0.Add(time.Duration(i)*time.Second))
		b.Touch("b", "c2", t0)
	}
	b.Event(store.Event{InstanceUID: "a", Kind: "connected"})
	if err := b.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if w.calls != 1 || len(w.seen) != 2 || len(w.events) != 1 {
		t.Fatalf("calls %d seen %v events %v", w.calls, w.seen, w.events)
	}
	for _, s := range w.seen {
		if s.UID == "a" && !s.At.Equal(t0.Add(999*time.Second)) {
			t.Fatalf("newest time not kept: %v", s.At)
		}
	}
	if s, e := b.Pending(); s != 0 || e != 0 {
		t.Fatal("pending after flush")
	}
}

func TestFailedFlushKeepsTheBatch(t *testing.T) {
	w := &fakeWriter{fail: true}
	b := New(w, time.Hour, nil, nil)
	b.Touch("a", "c", time.Unix(1, 0))
	b.Event(store.Event{InstanceUID: "a", Kind: "x"})
	if err := b.Flush(context.Background()); err == nil {
		t.Fatal("no error")
	}
	b.Touch("a", "c", time.Unix(2, 0))
	if s, e := b.Pending(); s != 1 || e != 1 {
		t.Fatalf("pending %d %d", s, e)
	}
	w.fail = false
	if err := b.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(w.seen) != 1 || !w.seen[0].At.Equal(time.Unix(2, 0)) || len(w.events) != 1 {
		t.Fatalf("%v %v", w.seen, w.events)
	}
}

func TestRunFlushesPeriodicallyAndStops(t *testing.T) {
	w := &fakeWriter{}
	b := New(w, 10*time.Millisecond, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.Run(ctx); close(done) }()
	b.Touch("a", "c", time.Now())
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		n := len(w.seen)
		w.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no periodic flush")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
}

// TouchOn carries the replica with the newest time of an agent's
// connection; an older touch from another replica does not replace it.
func TestTouchOnCarriesTheReplica(t *testing.T) {
	w := &fakeWriter{}
	b := New(w, time.Hour, nil, nil)
	t0 := time.Unix(1000, 0)
	b.TouchOn("h", "http", "r1", t0)
	b.TouchOn("h", "http", "r2", t0.Add(time.Second))
	b.TouchOn("h", "http", "r3", t0.Add(-time.Second))
	b.Touch("w", "c1", t0)
	if err := b.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := map[string]store.Seen{}
	for _, s := range w.seen {
		got[s.UID] = s
	}
	if h := got["h"]; h.Replica != "r2" || !h.At.Equal(t0.Add(time.Second)) {
		t.Errorf("plain-HTTP agent: %+v", h)
	}
	if ws := got["w"]; ws.Replica != "" {
		t.Errorf("WebSocket agent got a replica: %+v", ws)
	}
}
