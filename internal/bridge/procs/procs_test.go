package procs

import (
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNext(t *testing.T) {
	for _, c := range []struct {
		name   string
		p, max int
		busy   []float64 // one interval each
		want   int       // after the last
	}{
		{"one P nearly a core busy for a second grows", 1, 4, []float64{0.85, 0.9}, 2},
		{"a burst of one interval does not", 1, 4, []float64{0.3, 0.95}, 1},
		{"a pause resets the count", 1, 4, []float64{0.9, 0.5, 0.9}, 1},
		{"one P at 0.8 cores stays", 1, 4, []float64{0.8, 0.8, 0.8}, 1},
		{"growth stops at the maximum", 4, 4, []float64{3.9, 3.9}, 4},
		{"doubling is capped by the maximum", 2, 3, []float64{1.9, 1.9}, 3},
		{"two Ps busy at 0.5 cores stay", 2, 4, []float64{0.1, 0.1, 0.5}, 2},
		{"two Ps nearly idle for two intervals stay", 2, 4, []float64{0.1, 0.1}, 2},
		{"the third idle interval halves", 2, 4, []float64{0.1, 0.1, 0.1}, 1},
		{"three Ps shrink to one", 3, 3, []float64{0.1, 0.1, 0.1}, 1},
		{"one P never shrinks", 1, 4, []float64{0, 0, 0, 0}, 1},
	} {
		var st state
		p := c.p
		for _, b := range c.busy {
			p = st.next(p, c.max, b)
		}
		if p != c.want {
			t.Errorf("%s: %d Ps after %v = %d, want %d", c.name, c.p, c.busy, p, c.want)
		}
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
	stop := start(4, 2*time.Millisecond, clock)
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
	stop := start(1, time.Millisecond, func() time.Duration { return 0 })
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
