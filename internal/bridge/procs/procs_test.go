package procs

import (
	"math"
	"os"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNext(t *testing.T) {
	const ms = time.Millisecond
	for _, c := range []struct {
		name    string
		p, max  int
		busy    []float64       // one interval each
		latency []time.Duration // p99 of each interval; nil: all 0
		want    int             // after the last
	}{
		{"one P nearly a core busy for a second grows", 1, 4, []float64{0.85, 0.9}, nil, 2},
		{"a burst of one interval does not", 1, 4, []float64{0.3, 0.95}, nil, 1},
		{"a pause resets the count", 1, 4, []float64{0.9, 0.5, 0.9}, nil, 1},
		{"one P at 0.8 cores stays", 1, 4, []float64{0.8, 0.8, 0.8}, nil, 1},
		{"growth stops at the maximum", 4, 4, []float64{3.9, 3.9}, nil, 4},
		{"doubling is capped by the maximum", 2, 3, []float64{1.9, 1.9}, nil, 3},
		{"two Ps busy at 0.5 cores stay", 2, 4, []float64{0.1, 0.1, 0.5}, nil, 2},
		{"two Ps nearly idle for two intervals stay", 2, 4, []float64{0.1, 0.1}, nil, 2},
		{"the third idle interval halves", 2, 4, []float64{0.1, 0.1, 0.1}, nil, 1},
		{"three Ps shrink to one", 3, 3, []float64{0.1, 0.1, 0.1}, nil, 1},
		{"one P never shrinks", 1, 4, []float64{0, 0, 0, 0}, nil, 1},

		{"one P at 0.7 cores with goroutines waiting grows", 1, 4, []float64{0.7, 0.7}, []time.Duration{6 * ms, 20 * ms}, 2},
		{"waiting alone grows, idle or not", 1, 4, []float64{0, 0}, []time.Duration{6 * ms, 6 * ms}, 2},
		{"waiting then busy counts in a row", 1, 4, []float64{0.2, 0.9}, []time.Duration{6 * ms, 0}, 2},
		{"latency at the threshold is not waiting", 1, 4, []float64{0.7, 0.7, 0.7}, []time.Duration{5 * ms, 5 * ms, 5 * ms}, 1},
		{"one interval of waiting does not grow", 1, 4, []float64{0.7, 0.7, 0.7}, []time.Duration{0, 9 * ms, 1 * ms}, 1},
		{"waiting at the maximum stays", 4, 4, []float64{0.1, 0.1, 0.1}, []time.Duration{9 * ms, 9 * ms, 9 * ms}, 4},
		{"no shrinking while goroutines wait", 2, 4, []float64{0.1, 0.1, 0.1, 0.1}, []time.Duration{0, 0, 9 * ms, 0}, 2},
		{"waiting at the maximum resets the shrink count", 2, 2, []float64{0.1, 0.1, 0.1, 0.1, 0.1}, []time.Duration{0, 0, 9 * ms, 0, 0}, 2},
		{"after growing for waiting, idle does not halve within the hold", 1, 4, append([]float64{0.1, 0.1}, repeat(0.1, holdAfterWait-1)...), append([]time.Duration{9 * ms, 9 * ms}, make([]time.Duration, holdAfterWait-1)...), 2},
		{"after growing for waiting, idle halves once the hold is over", 1, 4, append([]float64{0.1, 0.1}, repeat(0.1, holdAfterWait+shrinkAfter)...), append([]time.Duration{9 * ms, 9 * ms}, make([]time.Duration, holdAfterWait+shrinkAfter)...), 1},
		{"after growing for CPU alone, idle halves without a hold", 1, 4, []float64{0.9, 0.9, 0.1, 0.1, 0.1}, nil, 1},
		{"idle without waiting then halves", 2, 2, []float64{0.1, 0.1, 0.1, 0.1, 0.1, 0.1}, []time.Duration{0, 0, 9 * ms, 0, 0, 0}, 1},
	} {
		var st state
		p := c.p
		for i, b := range c.busy {
			var l time.Duration
			if c.latency != nil {
				l = c.latency[i]
			}
			p = st.next(p, c.max, b, l)
		}
		if p != c.want {
			t.Errorf("%s: %d Ps after busy %v, latency %v = %d, want %d", c.name, c.p, c.busy, c.latency, p, c.want)
		}
	}
}

// hist is a histogram with the runtime's bucket shape for tests: buckets
// [-Inf, 0), [0, 1ms), [1ms, 2ms), ..., [99ms, +Inf).
func hist(counts map[int]uint64) *metrics.Float64Histogram {
	h := &metrics.Float64Histogram{Counts: make([]uint64, 102)}
	h.Buckets = append(h.Buckets, math.Inf(-1))
	for ms := 0; ms < 100; ms++ {
		h.Buckets = append(h.Buckets, float64(ms)/1000)
	}
	h.Buckets = append(h.Buckets, math.Inf(1))
	for ms, n := range counts {
		h.Counts[ms+1] = n // bucket [ms, ms+1)
	}
	return h
}

func TestP99(t *testing.T) {
	const ms = time.Millisecond
	for _, c := range []struct {
		name      string
		prev, cur *metrics.Float64Histogram
		want      time.Duration
	}{
		{"no events", hist(nil), hist(nil), 0},
		{"no runtime histogram", nil, nil, 0},
		{"first sample: all of cur", nil, hist(map[int]uint64{0: 98, 7: 2}), 7 * ms},
		{"99 fast, 1 slow: the slow one is beyond the 99th", hist(nil), hist(map[int]uint64{0: 99, 7: 1}), 0},
		{"98 fast, 2 slow", hist(nil), hist(map[int]uint64{0: 98, 7: 2}), 7 * ms},
		{"990 fast, 10 slow: p99 is the last fast one", hist(nil), hist(map[int]uint64{0: 990, 7: 10}), 0},
		{"989 fast, 11 slow", hist(nil), hist(map[int]uint64{0: 989, 7: 11}), 7 * ms},
		{"old slow events are not counted again",
			hist(map[int]uint64{0: 10, 40: 50}), hist(map[int]uint64{0: 1010, 2: 5, 40: 50}), 0},
		{"the interval's own slow events are",
			hist(map[int]uint64{0: 10, 40: 50}), hist(map[int]uint64{0: 1010, 2: 5, 40: 70}), 40 * ms},
		{"a latency beyond the last bound",
			nil, &metrics.Float64Histogram{Counts: []uint64{0, 1}, Buckets: []float64{0, 0.001, math.Inf(1)}}, 1 * ms},
		{"a histogram of another shape", hist(nil), &metrics.Float64Histogram{Counts: []uint64{5}, Buckets: []float64{0, 1}}, 0},
		{"counts that went back", hist(map[int]uint64{9: 5}), hist(map[int]uint64{9: 4}), 0},
	} {
		if got := p99(c.prev, c.cur); got != c.want {
			t.Errorf("%s: p99 = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestRuntimeHistogram: this runtime has the scheduling-latency
// histogram, and its counts grow as goroutines are scheduled.
func TestRuntimeHistogram(t *testing.T) {
	a := schedHist()
	if a == nil {
		t.Fatalf("runtime/metrics has no %s", schedLatencies)
	}
	for i := 0; i < 100; i++ {
		done := make(chan struct{})
		go func() { close(done) }()
		<-done
	}
	b := schedHist()
	var na, nb uint64
	for i := range a.Counts {
		na += a.Counts[i]
		nb += b.Counts[i]
	}
	if nb <= na {
		t.Errorf("scheduling events counted: %d, then %d after 100 goroutines ran", na, nb)
	}
}

// TestGrowsWhenGoroutinesQueue runs the controller with the runtime's
// real scheduling latencies and a CPU clock that says the process is
// idle, so that only the latency can make it grow: every 40 ms eight
// goroutines become runnable at once and each spins for 2.5 ms, half a
// core in all, so on one P the later ones wait up to 17.5 ms to run. The
// controller must add a P. (A loaded machine only lengthens the waits.)
func TestGrowsWhenGoroutinesQueue(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	stop := start(2, 50*time.Millisecond, func() time.Duration { return 0 }, schedHist)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	work := make([]chan struct{}, 8)
	for i := range work {
		work[i] = make(chan struct{}, 1)
		wg.Add(1)
		go func(ch <-chan struct{}) {
			defer wg.Done()
			for {
				select {
				case <-quit:
					return
				case <-ch:
				}
				for t0 := time.Now(); time.Since(t0) < 2500*time.Microsecond; {
				}
			}
		}(work[i])
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(40 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
			}
			for _, ch := range work {
				select {
				case ch <- struct{}{}:
				default: // still busy with the last round
				}
			}
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for runtime.GOMAXPROCS(0) != 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	got := runtime.GOMAXPROCS(0)
	close(quit)
	wg.Wait()
	stop()
	if got != 2 {
		t.Errorf("GOMAXPROCS = %d after 20 s of goroutines queueing at one P, want 2", got)
	}
	if got := runtime.GOMAXPROCS(0); got != before {
		t.Errorf("GOMAXPROCS after stop = %d, want %d", got, before)
	}
}

// TestControllerFollowsLoad drives the controller with a CPU clock that
// runs at a chosen number of cores: it starts at one P, doubles while the
// process is busy, halves when the load falls, and stop restores the
// value from before.
func TestControllerFollowsLoad(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	var cores atomic.Int64 // in thousandths
	cores.Store(100)
	var cpu atomic.Int64
	last := time.Now()
	clock := func() time.Duration {
		// Called from the controller's goroutine only.
		now := time.Now()
		cpu.Add(int64(now.Sub(last)) * cores.Load() / 1000)
		last = now
		return time.Duration(cpu.Load())
	}
	// No scheduling latencies: the CPU clock alone drives it (the machine's
	// real run-queue waits would hold off the shrinking at random).
	stop := start(4, 2*time.Millisecond, clock, func() *metrics.Float64Histogram { return nil })
	if got := runtime.GOMAXPROCS(0); got != 1 {
		stop()
		t.Fatalf("GOMAXPROCS after start = %d, want 1", got)
	}
	waitFor := func(want int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for runtime.GOMAXPROCS(0) != want {
			if time.Now().After(deadline) {
				stop()
				t.Fatalf("GOMAXPROCS = %d, want %d within 20s", runtime.GOMAXPROCS(0), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	cores.Store(3000) // three cores busy: 1 → 2 → 4
	waitFor(4)
	cores.Store(50)
	waitFor(1)
	stop()
	if got := runtime.GOMAXPROCS(0); got != before {
		t.Fatalf("GOMAXPROCS after stop = %d, want %d", got, before)
	}
}

// TestExplicitGOMAXPROCS: an operator's GOMAXPROCS is left alone.
func TestExplicitGOMAXPROCS(t *testing.T) {
	t.Setenv("GOMAXPROCS", "3")
	before := runtime.GOMAXPROCS(0)
	stop := Start()
	if got := runtime.GOMAXPROCS(0); got != before {
		t.Errorf("GOMAXPROCS = %d with GOMAXPROCS set in the environment, want it unchanged (%d)", got, before)
	}
	stop()
}

// TestSingleCPU: with one CPU there is nothing to control and no
// goroutine runs (goleak checks).
func TestSingleCPU(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	stop := start(1, time.Millisecond, func() time.Duration { return 0 }, schedHist)
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Errorf("GOMAXPROCS = %d, want 1", got)
	}
	stop()
	if got := runtime.GOMAXPROCS(0); got != before {
		t.Errorf("GOMAXPROCS after stop = %d, want %d", got, before)
	}
}

// TestDocs: the operator's manual states the rule as the code runs it.
func TestDocs(t *testing.T) {
	raw, err := os.ReadFile("../../../docs/bridge.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(strings.Fields(string(raw)), " "), Rule()) {
		t.Errorf("docs/bridge.md does not state the GOMAXPROCS rule as the code runs it; it should say:\n%s", Rule())
	}
}

// repeat is n copies of v.
func repeat(v float64, n int) []float64 {
	r := make([]float64, n)
	for i := range r {
		r[i] = v
	}
	return r
}
