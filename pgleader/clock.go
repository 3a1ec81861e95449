package pgleader

import "time"

// Clock supplies the readings behind the leader's own view of its
// leadership: the time of the last answered confirmation and the check
// against it. Only differences between readings of one Clock are used.
type Clock interface {
	Now() time.Time
}

// SystemClock is the host clock (time.Now, monotonic).
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }
