package lease

import (
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkBootTimeSyscall is CLOCK_BOOTTIME read by the system call, the
// fallback where the vDSO has no usable clock_gettime (compare
// BenchmarkValid/boottime).
func BenchmarkBootTimeSyscall(b *testing.B) {
	var ts unix.Timespec
	for b.Loop() {
		bootTimeSyscall(&ts)
	}
}
