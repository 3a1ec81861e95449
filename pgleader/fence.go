package pgleader

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Term fencing: every write of a leader job commits only while the term
// it was started in is current.

// Leadership is one term of this replica's leadership, handed to
// Config.OnElected. The leader jobs of the term run under Context and write
// through InTerm (or Fence in a transaction of their own): the database
// refuses their writes once the term is over, also when this replica leads
// again in a later term.
type Leadership struct {
	e    *Elector
	ctx  context.Context
	term int64
}

// Term is the number of the term; terms increase with every new leader.
func (l *Leadership) Term() int64 { return l.term }

// Context is cancelled when the term ends (at the latest T/2 after the
// last answered confirmation of the lock session).
func (l *Leadership) Context() context.Context { return l.ctx }

// current reports whether the term still leads by this replica's own view
// (its clock included), as a *StaleTermError when not.
func (l *Leadership) current() error {
	_, term, ok := l.e.leaderContext()
	if !ok || term != l.term || l.ctx.Err() != nil {
		return &StaleTermError{Term: l.term, Reason: "replica " + l.e.cfg.ID + " no longer leads in this term"}
	}
	return nil
}

// InTerm runs fn in a transaction on the pool that is fenced by the term:
// it first runs CheckTerm (locking the term row FOR SHARE), so fn's writes
// commit only while the term is current and no new term can start until
// the transaction ends. fn's context is cancelled when leadership ends.
// When the term is over InTerm returns a *StaleTermError
// (errors.Is(err, ErrStaleTerm)) and fn does not run (or its transaction
// rolls back). The transaction ends itself when idle for longer than T/2.
func (l *Leadership) InTerm(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	e, lctx, term := l.e, l.ctx, l.term
	if err := l.current(); err != nil {
		return err
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

// Fence checks, inside a transaction of the caller on any connection of the
// database, that the term is still current (see CheckTerm). Use it as the
// first statement of a leader job's own transaction.
func (l *Leadership) Fence(ctx context.Context, tx pgx.Tx) error {
	if err := l.current(); err != nil {
		return err
	}
	return l.e.fence(ctx, tx, l.term)
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
