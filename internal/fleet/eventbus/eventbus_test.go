package eventbus

import (
	"context"
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

func (t *target) Push(_ context.Context, uid string) {
	t.mu.Lock()
	t.pushed = append(t.pushed, uid)
	t.mu.Unlock()
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
