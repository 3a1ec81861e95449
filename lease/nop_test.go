package lease

import (
	"context"
	"time"
)

type nopStore struct{}

func (nopStore) Acquire(context.Context, Claim) (Token, error)             { return Token{}, ErrHeld }
func (nopStore) Renew(context.Context, string, Token, time.Duration) error { return nil }
func (nopStore) Release(context.Context, string, Token) error              { return nil }
func (nopStore) Current(context.Context, string) (Record, error)           { return Record{}, nil }
func (nopStore) Close() error                                              { return nil }
