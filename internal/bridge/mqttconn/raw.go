package mqttconn

import (
	"io"
	"net"
	"syscall"
	"unsafe"
)

// rawIO reads and writes a plain TCP connection with raw system calls on
// its non-blocking socket, waiting through Go's poller only when the
// socket is not ready (syscall.RawConn).
//
// Why: every read and write through net.Conn enters the scheduler's
// system call state, and entering it while all of the process's Ps are
// idle wakes the runtime's monitor thread (sysmon), which then polls every
// 20µs for a while before it sleeps again. At a modest message rate the
// bridge is idle between messages, so each message paid several of those
// wake-ups: on the benchmark machine sysmon's sleeps and wake-ups were a
// fifth of the bridge's CPU (perf). A read or write of a non-blocking
// socket returns at once, so it needs none of that.
//
// Reads come from one goroutine (the Conn's bufio.Reader) and writes from
// one at a time (the Conn's writer), so each direction has its own
// closure and fields, allocated once.
type rawIO struct {
	rc syscall.RawConn

	rbuf    []byte
	rn      int
	rerr    error
	readFn  func(fd uintptr) bool
	wbuf    []byte
	wn      int
	werr    error
	writeFn func(fd uintptr) bool
}

func newRawIO(c *net.TCPConn) *rawIO {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil
	}
	r := &rawIO{rc: rc}
	r.readFn = func(fd uintptr) bool {
		for {
			n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&r.rbuf[0])), uintptr(len(r.rbuf)))
			switch {
			case e == syscall.EINTR:
				continue
			case e == syscall.EAGAIN:
				return false // wait until readable
			case e != 0:
				r.rn, r.rerr = 0, e
			case n == 0:
				r.rn, r.rerr = 0, io.EOF
			default:
				r.rn, r.rerr = int(n), nil
			}
			return true
		}
	}
	r.writeFn = func(fd uintptr) bool {
		for r.wn < len(r.wbuf) {
			n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&r.wbuf[r.wn])), uintptr(len(r.wbuf)-r.wn))
			switch e {
			case 0:
				r.wn += int(n)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false // wait until writable
			default:
				r.werr = e
				return true
			}
		}
		return true
	}
	return r
}

func (r *rawIO) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.rbuf = p
	err := r.rc.Read(r.readFn)
	r.rbuf = nil
	if err != nil {
		return 0, err // closed, or the read deadline passed
	}
	return r.rn, r.rerr
}

func (r *rawIO) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.wbuf, r.wn, r.werr = p, 0, nil
	err := r.rc.Write(r.writeFn)
	n := r.wn
	r.wbuf = nil
	if err == nil {
		err = r.werr
	}
	return n, err
}

// rawTCP is a TCP connection whose reads and writes are raw system calls,
// for a TLS connection on top of it.
type rawTCP struct {
	*net.TCPConn
	raw *rawIO
}

func (c *rawTCP) Read(p []byte) (int, error)  { return c.raw.Read(p) }
func (c *rawTCP) Write(p []byte) (int, error) { return c.raw.Write(p) }
