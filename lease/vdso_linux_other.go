//go:build linux && !amd64

package lease

import "golang.org/x/sys/unix"

// bootTimeVDSO is not implemented on this architecture: BootClock makes
// the system call.
func bootTimeVDSO(*unix.Timespec) bool { return false }
