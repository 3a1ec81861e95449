package transport

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
)

// Reconcile unsubscribes what a resumed session holds that the
// configuration dropped, subscribes, retries the refused filters once,
// and serves degraded (not failed) when the broker still refuses one.
func TestReconcile(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	cfg := Config{Subscriptions: []Subscription{{Filter: "a/#", QoS: 1}, {Filter: "b/#", QoS: 1}}}
	st := SubscriptionState{File: filepath.Join(t.TempDir(), "state.json"), ClientID: "c", Log: log}
	st.Save(nil, map[string]bool{"old/#": true, "a/#": true})

	var unsubscribed []string
	var subscribeCalls [][]string
	refuse := map[string]int{"b/#": 1} // refused once, granted on the retry
	r := Reconciler{
		SessionPresent: true,
		Unsubscribe:    func(_ context.Context, f []string) error { unsubscribed = append(unsubscribed, f...); return nil },
		Subscribe: func(_ context.Context, subs []Subscription) (map[string]bool, error) {
			subscribeCalls = append(subscribeCalls, Filters(subs))
			g := map[string]bool{}
			for _, s := range subs {
				if refuse[s.Filter] > 0 {
					refuse[s.Filter]--
					continue
				}
				g[s.Filter] = true
			}
			return g, nil
		},
	}
	full, err := Reconcile(context.Background(), cfg, st, r, log)
	if err != nil || !full {
		t.Fatalf("full %v, err %v", full, err)
	}
	if !slices.Equal(unsubscribed, []string{"old/#"}) || len(subscribeCalls) != 2 || !slices.Equal(subscribeCalls[1], []string{"b/#"}) {
		t.Fatalf("unsubscribed %v, subscribe calls %v", unsubscribed, subscribeCalls)
	}

	// A new broker session holds nothing: no UNSUBSCRIBE; a filter refused
	// twice leaves the session degraded, not failed.
	unsubscribed, subscribeCalls = nil, nil
	refuse = map[string]int{"b/#": 2}
	r.SessionPresent = false
	st.Save(nil, map[string]bool{"old/#": true})
	if full, err := Reconcile(context.Background(), cfg, st, r, log); err != nil || full || len(unsubscribed) != 0 {
		t.Fatalf("degraded: full %v, err %v, unsubscribed %v", full, err, unsubscribed)
	}

	// A step that fails is an activation error.
	r.Subscribe = func(context.Context, []Subscription) (map[string]bool, error) { return nil, errors.New("no SUBACK") }
	if _, err := Reconcile(context.Background(), cfg, st, r, log); !errors.Is(err, ErrActivation) {
		t.Fatalf("err %v, want ErrActivation", err)
	}
}

// Dial tries two brokers in turn and never connects once the tenure ended.
func TestDial(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	cfg := Config{Brokers: []string{"x", "y", "z"}}
	var tried []string
	fail := func(_ context.Context, b string) error { tried = append(tried, b); return errors.New("refused") }
	if err := Dial(context.Background(), cfg, 1, func() bool { return true }, log, fail); err == nil || !slices.Equal(tried, []string{"z", "x"}) {
		t.Fatalf("err %v, tried %v", err, tried)
	}
	tried = nil
	if err := Dial(context.Background(), cfg, 0, func() bool { return false }, log, fail); !errors.Is(err, ErrTenureEnded) || len(tried) != 0 {
		t.Fatalf("ended tenure: err %v, tried %v", err, tried)
	}
}
