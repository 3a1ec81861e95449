package eventbus

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type target struct {
	mu         sync.Mutex
	pushed     []string
	reconciles atomic.Int64
}

func (t *target) PushBatch(_ context.Context, payloads []string) {
	t.mu.Lock()
	t.pushed = append(t.pushed, payloads...)
	t.mu.Unlock()
}

func (t *target) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pushed)
}

func (t *target) Reconcile(context.Context) error { t.reconciles.Add(1); return nil }

// A notification is pushed; a reconnect of the listener session triggers a
// reconcile at once, long before the periodic one; Run stops with its context.
func TestNotificationsAndReconcileAfterReconnect(t *testing.T) {
	tg := &target{}
	reconnected := make(chan struct{})
	listen := func(ctx context.Context, ch []string, fn func(*pgconn.Notification), onReconnect func()) error {
		if len(ch) != 1 || ch[0] != "chan" {
			t.Errorf("channels %v", ch)
		}
		fn(&pgconn.Notification{Channel: "chan", Payload: "agent-1"})
		onReconnect()
		close(reconnected)
		<-ctx.Done()
		return nil
	}
	b := New(listen, "chan", tg, time.Hour, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.Run(ctx); close(done) }()
	<-reconnected
	deadline := time.Now().Add(10 * time.Second)
	for tg.reconciles.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if tg.reconciles.Load() != 1 {
		t.Fatalf("reconciles after reconnect: %d", tg.reconciles.Load())
	}
	for tg.count() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	tg.mu.Lock()
	if len(tg.pushed) != 1 || tg.pushed[0] != "agent-1" {
		t.Fatalf("pushed %v", tg.pushed)
	}
	tg.mu.Unlock()
	cancel()
	<-done
}

func TestPeriodicReconcile(t *testing.T) {
	tg := &target{}
	listen := func(ctx context.Context, _ []string, _ func(*pgconn.Notification), _ func()) error {
		<-ctx.Done()
		return nil
	}
	b := New(listen, "chan", tg, 10*time.Millisecond, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.Run(ctx); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for tg.reconciles.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if tg.reconciles.Load() < 3 {
		t.Fatal("no periodic reconcile")
	}
}

// blockingTarget holds its first batch until released, so that a burst of
// notifications piles up behind it.
type blockingTarget struct {
	target
	first   chan struct{}
	release chan struct{}
	batches atomic.Int64
}

func (t *blockingTarget) PushBatch(ctx context.Context, payloads []string) {
	if t.batches.Add(1) == 1 {
		close(t.first)
		<-t.release
	}
	t.target.PushBatch(ctx, payloads)
}

// Notifications that arrive while a batch is delivered are delivered
// together in the next batch, in arrival order, each payload once; the
// listener is never held by a delivery.
func TestBurstIsDeliveredInBatchesWithoutDuplicates(t *testing.T) {
	tg := &blockingTarget{first: make(chan struct{}), release: make(chan struct{})}
	sent := make(chan struct{})
	listen := func(ctx context.Context, _ []string, fn func(*pgconn.Notification), _ func()) error {
		fn(&pgconn.Notification{Payload: "a0"})
		<-tg.first
		// The deliverer is stuck in the first batch; the listener must
		// still take every notification at once.
		for i := range 1000 {
			fn(&pgconn.Notification{Payload: fmt.Sprintf("a%d", i%500+1)})
		}
		close(sent)
		<-ctx.Done()
		return nil
	}
	b := New(listen, "chan", tg, time.Hour, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.Run(ctx); close(done) }()
	select {
	case <-sent:
	case <-time.After(10 * time.Second):
		t.Fatal("the listener was held while a batch was delivered")
	}
	close(tg.release)
	deadline := time.Now().Add(10 * time.Second)
	for tg.count() < 501 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	tg.mu.Lock()
	defer tg.mu.Unlock()
	if len(tg.pushed) != 501 {
		t.Fatalf("pushed %d payloads, want 501 (a0 and a1..a500 once each)", len(tg.pushed))
	}
	for i, p := range tg.pushed {
		if want := fmt.Sprintf("a%d", i); p != want {
			t.Fatalf("payload %d is %q, want %q (arrival order)", i, p, want)
		}
	}
	if n := tg.batches.Load(); n != 2 {
		t.Fatalf("%d batches, want 2 (the first, then the whole burst)", n)
	}
}
