// Package eventbus carries changes between replicas: a change that concerns
// an agent (a new remote config) is announced with NOTIFY in the
// transaction that makes it, every replica LISTENs on the keepalive-tuned
// listener session of pgleader and delivers it to the agent if it is
// connected there. A periodic reconcile, and one after every reconnect of
// the listener session, is the safety net for notifications that were
// lost while no session listened.
package eventbus

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
)

// ListenFunc is pgleader.Elector.Listen.
type ListenFunc func(ctx context.Context, channels []string, fn func(*pgconn.Notification), onReconnect func()) error

// Target is what the bus delivers to (the OpAMP server).
type Target interface {
	// PushBatch delivers the notifications' payloads, in the order they
	// arrived, each at most once per batch. A batch is whatever arrived
	// while the previous one was delivered, so a burst (a rollout wave of
	// thousands of agents) costs a few queries instead of one per agent.
	PushBatch(ctx context.Context, payloads []string)
	Reconcile(ctx context.Context) error
}

// Bus runs the listener and the reconcile loop.
type Bus struct {
	Listen   ListenFunc
	Channel  string
	Target   Target
	Interval time.Duration
	Log      *slog.Logger

	notifications prometheus.Counter
	reconciles    prometheus.Counter
	reconcileErrs prometheus.Counter
	kick          chan struct{}

	// The listener only queues; the deliverer drains the queue. Holding
	// the listener in a query per notification is what capped delivery at
	// a few hundred agents a second.
	mu      sync.Mutex
	queued  map[string]struct{}
	order   []string
	pending chan struct{}
}

// New returns a bus; reg may be nil.
func New(listen ListenFunc, channel string, t Target, interval time.Duration, log *slog.Logger, reg prometheus.Registerer) *Bus {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Bus{Listen: listen, Channel: channel, Target: t, Interval: interval, Log: log.With("component", "eventbus"), kick: make(chan struct{}, 1),
		queued: map[string]struct{}{}, pending: make(chan struct{}, 1),
		notifications: prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_eventbus_notifications_total", Help: "Notifications received on the listener session."}),
		reconciles:    prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_eventbus_reconciles_total", Help: "Reconcile passes (periodic and after a listener reconnect)."}),
		reconcileErrs: prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_eventbus_reconcile_failures_total", Help: "Failed reconcile passes."}),
	}
	if reg != nil {
		reg.MustRegister(b.notifications, b.reconciles, b.reconcileErrs)
	}
	return b
}

// Run listens and reconciles until ctx ends; it returns when both loops
// have stopped.
func (b *Bus) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() {
		err := b.Listen(ctx, []string{b.Channel}, func(n *pgconn.Notification) {
			b.notifications.Inc()
			b.enqueue(n.Payload)
		}, func() {
			select {
			case b.kick <- struct{}{}:
			default:
			}
		})
		if err != nil {
			b.Log.Error("event bus listener stopped", "error", err)
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-b.pending:
			}
			if batch := b.take(); len(batch) > 0 {
				b.Target.PushBatch(ctx, batch)
			}
		}
	})
	wg.Go(func() {
		t := time.NewTicker(b.Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-b.kick:
			}
			b.reconciles.Inc()
			if err := b.Target.Reconcile(ctx); err != nil && ctx.Err() == nil {
				b.reconcileErrs.Inc()
				b.Log.Warn("reconcile failed", "error", err)
			}
		}
	})
	wg.Wait()
}

// enqueue adds payload unless it is already waiting: a payload names what
// changed, and the delivery reads the current state, so one delivery
// covers every notification that arrived before it started.
func (b *Bus) enqueue(payload string) {
	b.mu.Lock()
	if _, ok := b.queued[payload]; !ok {
		b.queued[payload] = struct{}{}
		b.order = append(b.order, payload)
	}
	b.mu.Unlock()
	select {
	case b.pending <- struct{}{}:
	default:
	}
}

// take empties the queue.
func (b *Bus) take() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	batch := b.order
	b.order = nil
	clear(b.queued)
	return batch
}
