package transport

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// Activation of a connection, for either protocol version. From the start
// of a connection attempt to ServiceLevelFull each step is bounded by its
// own timeout, and the whole runs under a context that ends at the
// declared bound (Config.Activation), so the bound the failover package
// adds to the budgets is true by construction:
//   - Dial: at most two connect attempts, each within connect_timeout;
//   - Reconcile: one UNSUBSCRIBE of the filters a resumed session holds
//     that the configuration no longer wants, one SUBSCRIBE of every
//     wanted filter and one of the refused ones again, each wait within
//     reconcile_timeout (three of the four the bound allows).

// Dial makes at most two connect attempts, on the brokers that attempt
// (the session's count of connections) and the try select in turn. It
// checks the tenure before each (a deposed owner never takes the shared
// client_id back) and stops early when ctx ends.
func Dial(ctx context.Context, cfg Config, attempt int, valid func() bool, log *slog.Logger, connect func(ctx context.Context, broker string) error) error {
	var err error
	for try := range 2 {
		if !valid() {
			return ErrTenureEnded
		}
		broker := cfg.Brokers[(attempt*2+try)%len(cfg.Brokers)]
		if err = connect(ctx, broker); err == nil {
			return nil
		}
		log.Warn("mqtt connect failed", "broker", broker, "err", err)
		if ctx.Err() != nil {
			break
		}
	}
	return err
}

// Reconciler is what Reconcile needs of one connection; each call waits
// for the broker's answer within reconcile_timeout.
type Reconciler struct {
	// SessionPresent is the broker's answer to the CONNECT: it resumed a
	// session (which may hold subscriptions).
	SessionPresent bool
	Unsubscribe    func(ctx context.Context, filters []string) error
	// Subscribe returns the filters the broker granted.
	Subscribe func(ctx context.Context, subs []Subscription) (map[string]bool, error)
}

// Reconcile brings the broker session's subscriptions to cfg's and records
// them in st. full is false when the broker refused a filter (the session
// serves degraded); an error is a step that failed or ran out of time.
func Reconcile(ctx context.Context, cfg Config, st SubscriptionState, r Reconciler, log *slog.Logger) (full bool, err error) {
	previous := st.Load()
	if !r.SessionPresent {
		previous = nil // a new broker session holds no subscriptions
	}
	if stale := StaleFilters(previous, cfg.Subscriptions); len(stale) > 0 {
		if err := r.Unsubscribe(ctx, stale); err != nil {
			return false, fmt.Errorf("%w: unsubscribe removed filters: %v", ErrActivation, err)
		}
		log.Info("unsubscribed filters no longer configured", "filters", stale)
		previous = nil
	}
	granted, err := r.Subscribe(ctx, cfg.Subscriptions)
	if err != nil {
		return false, fmt.Errorf("%w: subscribe: %v", ErrActivation, err)
	}
	if missing := MissingOf(cfg.Subscriptions, granted); len(missing) > 0 {
		again, err := r.Subscribe(ctx, missing)
		if err != nil {
			return false, fmt.Errorf("%w: subscribe retry: %v", ErrActivation, err)
		}
		for k := range again {
			granted[k] = true
		}
	}
	st.Save(previous, granted)
	if missing := MissingOf(cfg.Subscriptions, granted); len(missing) > 0 {
		log.Error("broker refused subscriptions; serving degraded", "filters", Filters(missing))
		return false, nil
	}
	return true, nil
}

// Filters are the topic filters of subs.
func Filters(subs []Subscription) []string {
	out := make([]string, len(subs))
	for i, s := range subs {
		out[i] = s.Filter
	}
	return out
}

// Activate is the activation after a connect, for either protocol
// version: the session serves degraded (setLevel) while Reconcile brings
// its subscriptions to cfg's, then fully, unless the broker refused a
// filter; activated records when it did (the unmatched grace runs from
// then). An error is a reconcile step that failed or ran out of time.
func Activate(ctx context.Context, cfg Config, st SubscriptionState, r Reconciler, log *slog.Logger, setLevel func(Level), activated func(time.Time)) error {
	setLevel(LevelDegraded)
	full, err := Reconcile(ctx, cfg, st, r, log)
	if err != nil {
		return err
	}
	if full {
		activated(time.Now())
		setLevel(LevelFull)
	}
	return nil
}

// Wanted reports whether topic matches one of subs' filters; a message
// that matches none is the residue of a removed subscription.
func Wanted(subs []Subscription, topic string) bool {
	for _, sub := range subs {
		if Match(sub.Filter, topic) {
			return true
		}
	}
	return false
}
