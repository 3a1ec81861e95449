// Package procs sizes the bridge's GOMAXPROCS to the CPU it uses: one P
// while the process uses less than most of a core, more (up to the
// runtime's own default) while it needs them.
//
// Why: a bridge forwarding a modest rate is idle between messages, and
// each message wakes it twice (the PUBLISH from the source broker, the
// acknowledgment from the destination). With more than one P the Go
// scheduler wakes a second thread to look for work whenever a goroutine
// becomes ready while a P is idle; that thread finds none and sleeps
// again, two context switches more per wake-up. With one P the thread that
// waits in the network poller runs the woken goroutine and waits again,
// like mosquitto's one epoll loop. On the benchmark machine (make bench)
// one P cut the bridge's CPU per message by about a third at 5,000 msg/s.
// One P would cap a busy bridge at one core, so the controller adds Ps as
// soon as the process keeps its Ps busy and returns to one when the load
// falls.
//
// An explicit GOMAXPROCS in the environment is respected: the controller
// then does nothing. The maximum is the runtime's default at start; setting
// GOMAXPROCS ends the runtime's own updates of it, so a container CPU limit
// changed later is followed only after a restart.
package procs

import (
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"
)

// Thresholds of the controller, in cores of process CPU time (user and
// system) per P, sampled every interval:
//
//   - grow: above growAt of the current Ps for growAfter intervals in a
//     row (a second), the Ps double (up to the maximum). With one P, 0.8:
//     the process is nearly a core busy and work starts waiting for the
//     P. A shorter burst is absorbed by the in-flight windows.
//   - shrink: below shrinkAt of half the current Ps for shrinkAfter
//     intervals in a row (1.5 s), the Ps halve. With two Ps, under 0.4
//     cores: well inside one P, with hysteresis against the grow
//     threshold so that a steady load does not flip between the two.
//
// A change of GOMAXPROCS stops the world for a moment (tens of µs), so a
// change every second or two costs nothing measurable.
const (
	interval    = 500 * time.Millisecond
	growAt      = 0.8
	growAfter   = 2
	shrinkAt    = 0.4
	shrinkAfter = 3
)

// Start sizes GOMAXPROCS for a bridge process unless the GOMAXPROCS
// environment variable is set: it sets one P and runs the controller
// until stop is called, which restores the runtime's value from before
// Start. The maximum is GOMAXPROCS as the runtime chose it at Start (the
// CPU count, or the container's CPU limit).
func Start() (stop func()) {
	if os.Getenv("GOMAXPROCS") != "" {
		return func() {}
	}
	return start(runtime.GOMAXPROCS(0), interval, cpuTime)
}

func start(maxProcs int, every time.Duration, cpu func() time.Duration) (stop func()) {
	before := runtime.GOMAXPROCS(1)
	if maxProcs <= 1 {
		return func() { runtime.GOMAXPROCS(before) }
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		run(maxProcs, every, cpu, quit)
	}()
	return func() {
		close(quit)
		<-done
		runtime.GOMAXPROCS(before)
	}
}

// run samples the process's CPU time every interval and resizes
// GOMAXPROCS by next until quit closes.
func run(maxProcs int, every time.Duration, cpu func() time.Duration, quit <-chan struct{}) {
	t := time.NewTicker(every)
	defer t.Stop()
	last, lastAt := cpu(), time.Now()
	var st state
	for {
		select {
		case <-quit:
			return
		case <-t.C:
		}
		now, at := cpu(), time.Now()
		busy := float64(now-last) / float64(at.Sub(lastAt))
		last, lastAt = now, at
		p := runtime.GOMAXPROCS(0)
		if np := st.next(p, maxProcs, busy); np != p {
			runtime.GOMAXPROCS(np)
		}
	}
}

// state counts the intervals in a row above the grow threshold and below
// the shrink threshold.
type state struct{ high, low int }

// next is the controller's decision for p Ps (at most maxProcs) after an
// interval in which the process used busy cores: the new number of Ps.
func (s *state) next(p, maxProcs int, busy float64) int {
	switch {
	case busy > growAt*float64(p) && p < maxProcs:
		s.low = 0
		if s.high++; s.high >= growAfter {
			s.high = 0
			return min(2*p, maxProcs)
		}
	case p > 1 && busy < shrinkAt*float64(p/2):
		s.high = 0
		if s.low++; s.low >= shrinkAfter {
			s.low = 0
			return max(1, p/2)
		}
	default:
		s.high, s.low = 0, 0
	}
	return p
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Rule is the controller's rule in words, for the operator's manual
// (docs/bridge.md quotes it; a test keeps the two equal).
func Rule() string {
	return fmt.Sprintf("`myriarch-bridge run` starts on one P (`GOMAXPROCS=1`) and doubles its Ps, up to the Go runtime's default (the CPU count, or the container's CPU limit rounded up and at least 2), once the process has used more than %.1f cores per P for %v; it halves them once it has used less than %.1f cores per P of the halved number for %v.",
		growAt, growAfter*interval, shrinkAt, shrinkAfter*interval)
}
