package lease

import (
	"time"
	"unsafe"

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
//
// It reads the clock through the vDSO, as time.Now reads its clocks: no
// system call. An exclusive session checks its tenure at every point of
// action, three times per bridged message, and on this project's
// virtualised development machine the clock_gettime system call cost
// 0.4–1.4 µs each against about 50 ns through the vDSO. Where the vDSO has
// no usable clock_gettime (other architectures, or a reading that did not
// agree with the system call's at start), it is a raw system call:
// clock_gettime never blocks, and the scheduler's system call bookkeeping
// (unix.ClockGettime) woke the runtime's monitor thread on every tenure
// check of an otherwise idle process.
func (BootClock) Now() time.Time {
	var ts unix.Timespec
	if !bootTimeVDSO(&ts) {
		bootTimeSyscall(&ts)
	}
	return time.Unix(ts.Unix())
}

// bootTimeSyscall reads CLOCK_BOOTTIME with the system call.
func bootTimeSyscall(ts *unix.Timespec) {
	if _, _, e := unix.RawSyscall(unix.SYS_CLOCK_GETTIME, unix.CLOCK_BOOTTIME, uintptr(unsafe.Pointer(ts)), 0); e != 0 {
		// Linux has had CLOCK_BOOTTIME since 2.6.39; a kernel without it
		// cannot run Go 1.26 binaries.
		panic("lease: CLOCK_BOOTTIME unavailable: " + e.Error())
	}
}

func defaultOwnerClock() Clock { return BootClock{} }
