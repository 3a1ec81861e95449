package transport

import (
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"slices"
)

// SubscriptionState is the file (Config.StateFile) that remembers which
// filters a client_id subscribed, so that a resumed session's filters that
// the configuration dropped are unsubscribed during activation: MQTT
// cannot list a session's subscriptions. Both protocol versions' sessions
// use the same file and format, so a session switched between versions
// still unsubscribes what it dropped.
type SubscriptionState struct {
	File     string
	ClientID string
	Log      *slog.Logger
}

// Load returns the remembered filters; nil without a file, or when it is
// missing or corrupt (logged).
func (st SubscriptionState) Load() []string {
	if st.File == "" {
		return nil
	}
	b, err := os.ReadFile(st.File)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			st.Log.Warn("reading the subscription state", "file", st.File, "err", err)
		}
		return nil
	}
	var s struct {
		Filters []string `json:"filters"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		st.Log.Warn("ignoring a corrupt subscription state", "file", st.File, "err", err)
		return nil
	}
	return s.Filters
}

// Save records what the broker session may hold now: the granted filters
// plus any earlier ones not yet unsubscribed. It writes a temporary file
// and renames it, so a crash leaves the old state or the new one.
func (st SubscriptionState) Save(previous []string, granted map[string]bool) {
	if st.File == "" {
		return
	}
	set := map[string]bool{}
	for _, p := range previous {
		set[p] = true
	}
	for f := range granted {
		set[f] = true
	}
	filters := make([]string, 0, len(set))
	for f := range set {
		filters = append(filters, f)
	}
	slices.Sort(filters)
	b, _ := json.Marshal(map[string]any{"client_id": st.ClientID, "filters": filters})
	tmp := st.File + ".tmp"
	if err := os.WriteFile(tmp, b, 0o640); err != nil {
		st.Log.Warn("writing the subscription state", "file", tmp, "err", err)
		return
	}
	if err := os.Rename(tmp, st.File); err != nil {
		st.Log.Warn("writing the subscription state", "file", st.File, "err", err)
	}
}

// StaleFilters is previous minus the wanted filters, sorted: what a
// resumed session still holds and must unsubscribe.
func StaleFilters(previous []string, want []Subscription) []string {
	var out []string
	for _, p := range previous {
		if !slices.ContainsFunc(want, func(w Subscription) bool { return w.Filter == p }) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// MissingOf returns the wanted subscriptions that were not granted.
func MissingOf(want []Subscription, granted map[string]bool) []Subscription {
	var out []Subscription
	for _, w := range want {
		if !granted[w.Filter] {
			out = append(out, w)
		}
	}
	return out
}
