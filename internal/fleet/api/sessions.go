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
	return a.guarded(ctx, source, id, "checking a UI session failed", a.o.Store.CheckSession)
}

// CloseSession ends a UI session (logout).
func (a *API) CloseSession(ctx context.Context, id string) error {
	return a.o.Store.DeleteSession(ctx, id)
}
