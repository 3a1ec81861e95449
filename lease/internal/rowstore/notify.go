package rowstore

import (
	"context"
	"sync"
)

// Watcher is implemented by backends that can tell at once that a lease was
// released. Watch runs until ctx ends and calls released with the id of
// every lease it sees released (spurious calls are harmless: they only wake
// a standby for one Acquire). It returns when ctx ends; on other failures
// it retries by itself.
type Watcher interface {
	Watch(ctx context.Context, released func(id string))
}

// Hub shares one Watch of a backend between all the standbys of a process:
// the first subscriber starts it, the last one to leave stops it.
type Hub struct {
	w Watcher

	mu     sync.Mutex
	subs   map[string]map[chan struct{}]struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

// NewHub returns a hub on w.
func NewHub(w Watcher) *Hub { return &Hub{w: w, subs: map[string]map[chan struct{}]struct{}{}} }

// Subscribe returns a channel that receives a value (at most one pending)
// whenever lease id is seen released, until ctx ends.
func (h *Hub) Subscribe(ctx context.Context, id string) <-chan struct{} {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	if h.subs[id] == nil {
		h.subs[id] = map[chan struct{}]struct{}{}
	}
	h.subs[id][ch] = struct{}{}
	if h.cancel == nil {
		wctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		h.cancel, h.done = cancel, done
		go func() {
			defer close(done)
			h.w.Watch(wctx, h.publish)
		}()
	}
	h.mu.Unlock()
	context.AfterFunc(ctx, func() { h.unsubscribe(id, ch) })
	return ch
}

func (h *Hub) unsubscribe(id string, ch chan struct{}) {
	h.mu.Lock()
	delete(h.subs[id], ch)
	if len(h.subs[id]) == 0 {
		delete(h.subs, id)
	}
	var done chan struct{}
	if len(h.subs) == 0 && h.cancel != nil {
		h.cancel()
		done = h.done
		h.cancel, h.done = nil, nil
	}
	h.mu.Unlock()
	if done != nil {
		<-done
	}
}

func (h *Hub) publish(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs[id] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Close stops the watch (the backend is closing).
func (h *Hub) Close() {
	h.mu.Lock()
	cancel, done := h.cancel, h.done
	h.cancel, h.done = nil, nil
	h.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// NotifyRelease implements lease.ReleaseNotifier: a channel that receives a
// value when lease id was released, for backends that can tell (Watcher);
// nil (never ready) for the others.
func (s *Store) NotifyRelease(ctx context.Context, id string) <-chan struct{} {
	if s.hub == nil {
		return nil
	}
	return s.hub.Subscribe(ctx, id)
}
