package testwait

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fatalTB records Fatalf instead of ending the test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) { f.msg = fmt.Sprintf(format, args...) }

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	took := Until(t, "third check", 5*time.Second, func() bool { return n.Add(1) >= 3 })
	if n.Load() != 3 {
		t.Fatalf("checked %d times, want 3", n.Load())
	}
	// Two pauses: 5 ms and 10 ms (the polls double up to maxPoll).
	if took < 15*time.Millisecond || took > 2*time.Second {
		t.Fatalf("took %v, want about 15ms", took)
	}
}

func TestUntilFailsTheTestAfterTheLimit(t *testing.T) {
	f := &fatalTB{TB: t}
	start := time.Now()
	Until(f, "never", 100*time.Millisecond, func() bool { return false })
	if elapsed := time.Since(start); elapsed < 100*time.Millisecond {
		t.Fatalf("gave up after %v, before the limit", elapsed)
	}
	if !strings.Contains(f.msg, "never: not within 100ms") {
		t.Fatalf("failure message %q does not name what and the limit", f.msg)
	}
}

func TestEventuallyReportsTheOutcome(t *testing.T) {
	if Eventually(50*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition that never holds was reported true")
	}
	if !Eventually(time.Second, func() bool { return true }) {
		t.Fatal("a condition that holds at once was reported false")
	}
}

// The polls slow down to maxPoll: a condition checked for 300 ms is
// checked at most about 300/20 + 3 times.
func TestPollsAreBounded(t *testing.T) {
	var n atomic.Int32
	Eventually(300*time.Millisecond, func() bool { n.Add(1); return false })
	if got := n.Load(); got > 20 {
		t.Fatalf("checked %d times in 300ms, want at most 20 (every %v after the first polls)", got, maxPoll)
	}
}
