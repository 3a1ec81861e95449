package api

import (
	"context"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// OpenSession starts a UI session for token t and returns its opaque id
// (the cookie value) and its lifetime. The raw API token never reaches the
// browser's cookie jar.
func (a *API) OpenSession(ctx context.Context, t store.Token) (string, time.Duration, error) {
	id, err := a.o.Store.CreateSession(ctx, t.ID, a.o.SessionTTL)
	return id, a.o.SessionTTL, err
}

// Session returns the token of a valid UI session from source. An unknown
// or expired session counts as a failed authentication of source.
func (a *API) Session(ctx context.Context, source, id string) (store.Token, error) {
	if a.failures.Blocked(source) {
		return store.Token{}, ErrTooManyFailures
	}
	t, ok, err := a.o.Store.CheckSession(ctx, id)
	if err != nil {
		a.o.Log.Warn("checking a UI session failed", "error", err)
		return store.Token{}, ErrUnavailable
	}
	if !ok {
		a.Failed(source)
		return store.Token{}, ErrInvalidToken
	}
	return t, nil
}

// CloseSession ends a UI session (logout).
func (a *API) CloseSession(ctx context.Context, id string) error {
	return a.o.Store.DeleteSession(ctx, id)
}
