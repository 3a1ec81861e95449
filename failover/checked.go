package failover

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// ErrOverflow reports that a budget does not fit in a time.Duration.
var ErrOverflow = errors.New("duration arithmetic overflows")

// sum adds durations and fails on overflow or on a negative term.
type sum struct {
	total time.Duration
	err   error
}

// add adds d, naming the term in the error when it is negative or overflows.
func (s *sum) add(term string, d time.Duration) {
	if s.err != nil {
		return
	}
	if d < 0 {
		s.err = fmt.Errorf("%s is negative (%v)", term, d)
		return
	}
	if s.total > math.MaxInt64-d {
		s.err = fmt.Errorf("adding %s (%v): %w", term, d, ErrOverflow)
		return
	}
	s.total += d
}

// mul returns n·d or an overflow error naming the term.
func mul(term string, n int64, d time.Duration) (time.Duration, error) {
	if n < 0 || d < 0 {
		return 0, fmt.Errorf("%s is negative (%d × %v)", term, n, d)
	}
	if n != 0 && d > time.Duration(math.MaxInt64/n) {
		return 0, fmt.Errorf("%s (%d × %v): %w", term, n, d, ErrOverflow)
	}
	return time.Duration(n) * d, nil
}

// ceilDiv returns ⌈a/b⌉ for a ≥ 0, b > 0.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}

// ceilMillis rounds d up to a whole millisecond.
func ceilMillis(d time.Duration) (time.Duration, error) {
	r := d % time.Millisecond
	if r == 0 {
		return d, nil
	}
	if d > math.MaxInt64-(time.Millisecond-r) {
		return 0, fmt.Errorf("rounding %v up to the millisecond: %w", d, ErrOverflow)
	}
	return d + time.Millisecond - r, nil
}
