package pgleader

import (
	"errors"
	"fmt"
)

// ErrStaleTerm matches (errors.Is) every *StaleTermError: fenced writes
// return one when this replica is not the leader or its term is no longer
// the current one.
var ErrStaleTerm = errors.New("pgleader: stale term")

// StaleTermError is the typed error of a rejected fenced write.
type StaleTermError struct {
	// Term is the term the write was fenced with (0: the replica did not
	// lead). Current is the current term in the database when it was read
	// (0: not read).
	Term, Current int64
	// Reason says why, e.g. "newer term", "lock no longer held".
	Reason string
	// Err is an underlying error (the end of leadership interrupted the
	// transaction), if any.
	Err error
}

func (e *StaleTermError) Error() string {
	msg := fmt.Sprintf("pgleader: stale term %d: %s", e.Term, e.Reason)
	if e.Current != 0 {
		msg += fmt.Sprintf(" (current term %d)", e.Current)
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is makes errors.Is(err, ErrStaleTerm) true.
func (e *StaleTermError) Is(target error) bool { return target == ErrStaleTerm }

// Unwrap returns the underlying error.
func (e *StaleTermError) Unwrap() error { return e.Err }
