package spool_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/spool"
	"github.com/myriarch/myriarch/internal/bridge/transport"
)

// outage is a destination that refuses everything while down and
// records what it accepted.
type outage struct {
	down atomic.Bool
	mu   sync.Mutex
	got  []string // topic=payload
}

func (o *outage) Send(m *sender.Message, done func(error)) {
	if m.Withdrawn() {
		done(sender.ErrWithdrawn)
		return
	}
	if o.down.Load() {
		done(errors.New("destination down"))
		return
	}
	o.mu.Lock()
	o.got = append(o.got, m.Topic+"="+string(m.Payload))
	o.mu.Unlock()
	done(nil)
}

func (o *outage) Close(context.Context) error { return nil }

func (o *outage) accepted() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.got...)
}

func openSpool(t *testing.T, dir string, o spool.Options) *spool.Spool {
	t.Helper()
	o.Dir = dir
	s, err := spool.Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func spooledRoute(sp routing.Spool, snd sender.Sender, dl *routing.DeadLetter) *routing.Route {
	return routing.NewRoute(routing.RouteConfig{ID: "r", Filters: []string{"#"}, MaxInFlight: 4, Spool: sp, DeadLetter: dl,
		Targets: []routing.Target{{ID: "s", Sender: snd, MaxAttempts: 1 << 20, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}}})
}

// TestSpoolOutlastsAnOutage: while the destination is down the source is
// acknowledged as soon as the spool holds a message, far beyond the
// route's max_in_flight; a closed route (a restart) leaves the unsettled
// records to the next; when the destination returns everything arrives,
// each topic in order, and the spool is empty.
func TestSpoolOutlastsAnOutage(t *testing.T) {
	dir := t.TempDir()
	sp := openSpool(t, dir, spool.Options{FsyncInterval: 5 * time.Millisecond})
	dst := &outage{}
	dst.down.Store(true)
	rt := spooledRoute(sp, dst, nil)
	d := &routing.Dispatcher{Session: "s", Routes: []*routing.Route{rt}}
	var acked atomic.Int32
	const n = 200
	for i := range n {
		d.Handle(&transport.Message{Topic: fmt.Sprintf("t/%d", i%4), Payload: []byte(fmt.Sprint(i)), QoS: 1, Received: time.Now()}, func() { acked.Add(1) })
	}
	if acked.Load() != n {
		t.Fatalf("%d of %d acknowledged to the source while the destination is down; want all (the spool holds them)", acked.Load(), n)
	}
	if rt.InFlight() > 4 {
		t.Fatalf("route holds %d, over max_in_flight 4", rt.InFlight())
	}
	// A restart in the middle of the outage: the route closes, the spool
	// closes and opens again.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_ = rt.WaitIdle(ctx)
	cancel()
	rt.Close()
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	sp = openSpool(t, dir, spool.Options{FsyncInterval: 5 * time.Millisecond})
	defer sp.Close()
	if st := sp.Stats(); st.Recovered != n {
		t.Fatalf("recovered %d, want %d", st.Recovered, n)
	}
	rt = spooledRoute(sp, dst, nil)
	defer rt.Close()
	dst.down.Store(false)
	deadline := time.Now().Add(5 * time.Second)
	for sp.Stats().Messages > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("spool still holds %d", sp.Stats().Messages)
		}
		time.Sleep(5 * time.Millisecond)
	}
	got := dst.accepted()
	last := map[string]int{}
	seen := map[string]bool{}
	for _, g := range got {
		topic, p, _ := strings.Cut(g, "=")
		var v int
		fmt.Sscan(p, &v)
		if v < last[topic] {
			t.Fatalf("topic %s out of order: %d after %d", topic, v, last[topic])
		}
		last[topic] = v
		seen[p] = true
	}
	if len(seen) != n {
		t.Fatalf("%d distinct messages delivered, want %d", len(seen), n)
	}
}

// TestSpoolFullDeadLetters: with the dead_letter policy a full spool
// writes the message to the dead-letter file and acknowledges it.
func TestSpoolFullDeadLetters(t *testing.T) {
	dir := t.TempDir()
	sp := openSpool(t, filepath.Join(dir, "spool"), spool.Options{MaxMessages: 3, Full: spool.FullDeadLetter})
	defer sp.Close()
	dst := &outage{}
	dst.down.Store(true)
	dlPath := filepath.Join(dir, "dl.jsonl")
	dl := routing.OpenDeadLetter(dlPath)
	defer dl.Close()
	rt := spooledRoute(sp, dst, dl)
	defer rt.Close()
	d := &routing.Dispatcher{Session: "s", Routes: []*routing.Route{rt}}
	var acked atomic.Int32
	for i := range 5 {
		d.Handle(&transport.Message{Topic: "t", Payload: []byte(fmt.Sprint(i)), QoS: 1}, func() { acked.Add(1) })
	}
	if acked.Load() != 5 {
		t.Fatalf("%d acknowledged, want 5 (3 spooled, 2 dead-lettered)", acked.Load())
	}
	lines := readLines(t, dlPath)
	if len(lines) != 2 || !strings.Contains(lines[0], "spool full") {
		t.Fatalf("dead-letter file: %q", lines)
	}
}

// TestSpoolFullBlocks: with the block policy a full spool holds the
// handler (the session stops reading) until a record settles.
func TestSpoolFullBlocks(t *testing.T) {
	sp := openSpool(t, t.TempDir(), spool.Options{MaxMessages: 6})
	defer sp.Close()
	dst := &outage{}
	dst.down.Store(true)
	rt := spooledRoute(sp, dst, nil)
	defer rt.Close()
	d := &routing.Dispatcher{Session: "s", Routes: []*routing.Route{rt}}
	var acked atomic.Int32
	handled := make(chan struct{})
	go func() {
		defer close(handled)
		for i := range 8 {
			d.Handle(&transport.Message{Topic: "t", Payload: []byte(fmt.Sprint(i)), QoS: 1}, func() { acked.Add(1) })
		}
	}()
	time.Sleep(100 * time.Millisecond)
	if a := acked.Load(); a != 6 {
		t.Fatalf("%d acknowledged with a full spool of 6, want 6", a)
	}
	dst.down.Store(false)
	select {
	case <-handled:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler stayed blocked after the destination came back")
	}
	if a := acked.Load(); a != 8 {
		t.Fatalf("%d acknowledged, want 8", a)
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}
