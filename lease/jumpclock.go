package lease

import (
	"sync/atomic"
	"time"
)

// JumpClock reads a base clock plus an offset that only grows. Jumping it
// forward is what a host suspend looks like to an owner: CLOCK_BOOTTIME
// (the deadline clock) moves on while Go's timers, which run on
// CLOCK_MONOTONIC, do not fire. Tests and the lab use it to freeze an owner
// through its deadline without stopping the process.
type JumpClock struct {
	// Base is the clock read; nil means the default owner clock
	// (BootClock on Linux).
	Base   Clock
	offset atomic.Int64
}

// Now is Base.Now() plus every jump so far.
func (c *JumpClock) Now() time.Time {
	base := c.Base
	if base == nil {
		base = defaultOwnerClock()
	}
	return base.Now().Add(time.Duration(c.offset.Load()))
}

// Jump moves the clock forward by d (a negative d is ignored: the clock
// is monotonic).
func (c *JumpClock) Jump(d time.Duration) {
	if d > 0 {
		c.offset.Add(int64(d))
	}
}
