package lease

import (
	"time"

	"golang.org/x/sys/unix"
)

// BootClock reads CLOCK_BOOTTIME, which, unlike the CLOCK_MONOTONIC behind
// time.Now, keeps counting while the host is suspended. The Manager uses
// it by default for the owner's local deadline, so an owner whose host
// slept through its deadline does not act on waking up. (Standbys measure
// observations with the store's clock, where not counting a suspend errs
// on the safe side.)
type BootClock struct{}

// Now returns CLOCK_BOOTTIME as a time.Time; only differences between its
// readings are meaningful.
func (BootClock) Now() time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		// Linux has had CLOCK_BOOTTIME since 2.6.39; a kernel without it
		// cannot run Go 1.26 binaries.
		panic("lease: CLOCK_BOOTTIME unavailable: " + err.Error())
	}
	return time.Unix(ts.Sec, ts.Nsec)
}

func defaultOwnerClock() Clock { return BootClock{} }
