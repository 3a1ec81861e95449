package pgleader

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Term fencing: every write of a leader job commits only while the term
// it was started in is current.

// InTerm runs fn in a transaction on the pool that is fenced by the current
// term: it first runs CheckTerm (locking the term row FOR SHARE), so fn's
// writes commit only while this replica's term is current and no new term
// can start until the transaction ends. fn's context is cancelled when
// leadership ends. Without leadership, or when the term is no longer
// current, InTerm returns a *StaleTermError (errors.Is(err, ErrStaleTerm))
// and fn does not run (or its transaction rolls back). The transaction ends itself when idle
// for longer than T/2.
func (e *Elector) InTerm(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	lctx, term, ok := e.LeaderContext()
	if !ok {
		return &StaleTermError{Reason: "replica " + e.cfg.ID + " does not lead"}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(lctx, cancel)
	defer stop()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return e.fencedErr(lctx, term, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL idle_in_transaction_session_timeout = %d", e.k.ResignAfter.Milliseconds())); err != nil {
		return e.fencedErr(lctx, term, err)
	}
	if err := e.fence(ctx, tx, term); err != nil {
		return e.fencedErr(lctx, term, err)
	}
	if err := fn(ctx, tx); err != nil {
		return e.fencedErr(lctx, term, err)
	}
	return e.fencedErr(lctx, term, tx.Commit(ctx))
}

// fencedErr turns a failure caused by the end of leadership into ErrStaleTerm.
func (e *Elector) fencedErr(lctx context.Context, term int64, err error) error {
	if err == nil || errors.Is(err, ErrStaleTerm) {
		return err
	}
	if lctx.Err() != nil {
		return &StaleTermError{Term: term, Reason: "leadership ended", Err: err}
	}
	return err
}

// Fence checks, inside a transaction of the caller on any connection of the
// database, that this replica's term is still current (see CheckTerm). Use
// it as the first statement of a leader job's own transaction.
func (e *Elector) Fence(ctx context.Context, tx pgx.Tx) error {
	_, term, ok := e.LeaderContext()
	if !ok {
		return &StaleTermError{Reason: "replica " + e.cfg.ID + " does not lead"}
	}
	return e.fence(ctx, tx, term)
}

func (e *Elector) fence(ctx context.Context, tx pgx.Tx, term int64) error {
	err := CheckTerm(ctx, tx, e.cfg.LockKey, term)
	if errors.Is(err, ErrStaleTerm) {
		select {
		case e.termLost <- term:
		default:
		}
	}
	return err
}
