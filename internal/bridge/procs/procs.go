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
// soon as the process keeps its Ps busy, or its goroutines wait for a P,
// and returns to one when the load falls.
//
// An explicit GOMAXPROCS in the environment is respected: the controller
// then does nothing. The maximum is the runtime's default at start; setting
// GOMAXPROCS ends the runtime's own updates of it, so a container CPU limit
// changed later is followed only after a restart.
package procs

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/metrics"
	"syscall"
	"time"
)

// Thresholds of the controller, in cores of process CPU time (user and
// system) per P, sampled every interval:
//
//   - grow: above growAt of the current Ps, or a 99th percentile of the
//     interval's scheduling latency (the time goroutines waited in a run
//     queue before they ran) above latencyAt, for growAfter intervals in
//     a row (a second), the Ps double (up to the maximum). With one P,
//     0.8: the process is nearly a core busy and work starts waiting for
//     the P. A shorter burst is absorbed by the in-flight windows.
//   - shrink: below shrinkAt of half the current Ps, and the scheduling
//     latency not above latencyAt, for shrinkAfter intervals in a row
//     (1.5 s), the Ps halve. With two Ps, under 0.4 cores: well inside
//     one P, with hysteresis against the grow threshold so that a steady
//     load does not flip between the two.
//
// Why the latency as well: CPU time alone left a bridge at 0.6–0.8 cores
// on one P indefinitely, at 60–80 % utilisation, where run-queue waits
// are longest; the lease renew loop and its response wait behind the
// local run queue (timer lateness at one P on a loaded host: 36–138 ms,
// 686 ms beside 32 CPU-bound goroutines). At the minimum lease TTL of 5 s
// the renewal runs about every 0.55 s with a 1 s call timeout, so waits
// of a few hundred ms cost a renewal. latencyAt is 5 ms: 1 % of the
// renewal cadence and 0.5 % of its timeout, so the Ps grow while the
// queue is still far from the waits that fail a renewal, yet a P with
// room does not reach it (measured at one P on the 2-core development
// machine at load 2: p99 0–2 µs per interval idle or at 2,000 wake-ups
// a second; docs/bridge.md has the numbers).
// The 99th percentile rather than the maximum, so that one stall (the
// host descheduling the thread once) in an interval is not enough; and
// two intervals in a row, as for the CPU.
//
// A change of GOMAXPROCS stops the world for a moment (tens of µs), so a
// change every second or two costs nothing measurable.
const (
	interval    = 500 * time.Millisecond
	growAt      = 0.8
	growAfter   = 2
	shrinkAt    = 0.4
	shrinkAfter = 3
	latencyAt   = 5 * time.Millisecond
	// holdAfterWait intervals (30 s) pass after a growth that waiting
	// goroutines caused before the Ps may halve again: at the lower
	// count they would wait again, and without the hold the controller
	// would flip between the two counts every few seconds.
	holdAfterWait = 60
)

// schedLatencies is the runtime's cumulative histogram of the time
// goroutines spent runnable before they ran.
const schedLatencies = "/sched/latencies:seconds"

// Start sizes GOMAXPROCS for a bridge process unless the GOMAXPROCS
// environment variable is set: it sets one P and runs the controller
// until stop is called, which restores the runtime's value from before
// Start. The maximum is GOMAXPROCS as the runtime chose it at Start (the
// CPU count, or the container's CPU limit).
func Start() (stop func()) {
	if os.Getenv("GOMAXPROCS") != "" {
		return func() {}
	}
	return start(runtime.GOMAXPROCS(0), interval, cpuTime, schedHist)
}

// start runs the controller with the clocks it samples passed in, so that
// tests can drive it: cpu is the process's CPU time so far, sched a
// cumulative histogram of scheduling latencies (each call a new one).
func start(maxProcs int, every time.Duration, cpu func() time.Duration, sched func() *metrics.Float64Histogram) (stop func()) {
	before := runtime.GOMAXPROCS(1)
	if maxProcs <= 1 {
		return func() { runtime.GOMAXPROCS(before) }
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		run(maxProcs, every, cpu, sched, quit)
	}()
	return func() {
		close(quit)
		<-done
		runtime.GOMAXPROCS(before)
	}
}

// run samples the process's CPU time and scheduling latencies every
// interval and resizes GOMAXPROCS by next until quit closes.
func run(maxProcs int, every time.Duration, cpu func() time.Duration, sched func() *metrics.Float64Histogram, quit <-chan struct{}) {
	t := time.NewTicker(every)
	defer t.Stop()
	last, lastAt, lastSched := cpu(), time.Now(), sched()
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
		cur := sched()
		latency := p99(lastSched, cur)
		lastSched = cur
		p := runtime.GOMAXPROCS(0)
		if np := st.next(p, maxProcs, busy, latency); np != p {
			runtime.GOMAXPROCS(np)
		}
	}
}

// state counts the intervals in a row above the grow threshold and below
// the shrink threshold.
type state struct {
	high, low int
	waited    bool // an interval of the current high run had goroutines waiting
	hold      int  // intervals left before the Ps may halve
}

// next is the controller's decision for p Ps (at most maxProcs) after an
// interval in which the process used busy cores and the 99th percentile
// of its goroutines' scheduling latency was latency: the new number of
// Ps.
func (s *state) next(p, maxProcs int, busy float64, latency time.Duration) int {
	waiting := latency > latencyAt
	if s.hold > 0 {
		s.hold--
	}
	switch {
	case (busy > growAt*float64(p) || waiting) && p < maxProcs:
		s.low = 0
		if waiting {
			s.waited = true
		}
		if s.high++; s.high >= growAfter {
			if s.waited {
				s.hold = holdAfterWait
			}
			s.high, s.waited = 0, false
			return min(2*p, maxProcs)
		}
	case p > 1 && busy < shrinkAt*float64(p/2) && !waiting && s.hold == 0:
		s.high, s.waited = 0, false
		if s.low++; s.low >= shrinkAfter {
			s.low = 0
			return max(1, p/2)
		}
	default:
		s.high, s.low, s.waited = 0, 0, false
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

// schedHist reads the runtime's cumulative scheduling-latency histogram
// into a new value (Read reuses a sample's storage, and run keeps the
// previous one to diff against).
func schedHist() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: schedLatencies}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil // unknown to this runtime: no latency signal
	}
	return s[0].Value.Float64Histogram()
}

// p99 is the 99th percentile of the latencies counted in cur and not yet
// in prev (two samples of the same cumulative histogram), or 0 if there
// are none. It is the lower bound of the bucket that holds the
// percentile, so it never overstates the latency (the runtime's buckets
// are a few percent wide at milliseconds).
func p99(prev, cur *metrics.Float64Histogram) time.Duration {
	if cur == nil || (prev != nil && len(prev.Counts) != len(cur.Counts)) {
		return 0
	}
	diff := make([]uint64, len(cur.Counts))
	var total uint64
	for i, c := range cur.Counts {
		if prev != nil {
			if c < prev.Counts[i] {
				return 0 // not the same histogram
			}
			c -= prev.Counts[i]
		}
		diff[i] = c
		total += c
	}
	if total == 0 {
		return 0
	}
	// The smallest latency with at least 99 % of the events at or below it.
	rank := (total*99 + 99) / 100
	var seen uint64
	for i, c := range diff {
		if seen += c; seen >= rank {
			lo := cur.Buckets[i]
			if math.IsInf(lo, -1) || lo < 0 {
				return 0
			}
			if math.IsInf(lo, 1) || lo > float64(math.MaxInt64)/1e9 {
				return math.MaxInt64
			}
			return time.Duration(lo * 1e9)
		}
	}
	return 0
}

// Rule is the controller's rule in words, for the operator's manual
// (docs/bridge.md quotes it; a test keeps the two equal).
func Rule() string {
	return fmt.Sprintf("`myriarch-bridge run` starts on one P (`GOMAXPROCS=1`) and doubles its Ps, up to the Go runtime's default (the CPU count, or the container's CPU limit rounded up and at least 2), once for %v (each of %d samples %v apart) the process has used more than %.1f cores per P or the 99th percentile of the time its goroutines waited to run (the Go runtime's `/sched/latencies:seconds`) has been above %v; it halves them once for %v it has used less than %.1f cores per P of the halved number with that percentile not above %v, and, after a growth that waiting goroutines caused, not before %v.",
		growAfter*interval, growAfter, interval, growAt, latencyAt, shrinkAfter*interval, shrinkAt, latencyAt, holdAfterWait*interval)
}
