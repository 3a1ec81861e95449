package lease

import (
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// TestBootTimeVDSO: the kernels this runs on (Linux on amd64 since 5.3)
// have CLOCK_BOOTTIME in the vDSO, so BootClock must not fall back to the
// system call here; every vDSO reading lies between the system call's
// readings around it, also with goroutines reading at the same time (and
// growing their stacks, which the call's frame must survive).
func TestBootTimeVDSO(t *testing.T) {
	if vdsoClockGettime() == 0 {
		t.Fatal("__vdso_clock_gettime not found or not agreeing with the system call: BootClock makes a system call per reading")
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := range 8 {
		wg.Go(func() {
			check(g, 2000, errs)
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

// check reads the clock n times at recursion depth depth (a deeper stack
// each goroutine), each vDSO reading between two system call readings.
func check(depth, n int, errs chan<- string) {
	if depth > 0 {
		var pad [512]byte
		check(depth-1, n, errs)
		_ = pad
		return
	}
	var before, via, after unix.Timespec
	for range n {
		bootTimeSyscall(&before)
		if !bootTimeVDSO(&via) {
			errs <- "vDSO reading failed"
			return
		}
		bootTimeSyscall(&after)
		if via.Nano() < before.Nano() || via.Nano() > after.Nano() {
			errs <- "vDSO reading outside the system call's readings around it"
			return
		}
	}
}
