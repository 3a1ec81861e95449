package authlimit

import (
	"testing"
	"time"
)

func TestLimitPerKeyAndWindow(t *testing.T) {
	now := time.Unix(1000, 0)
	l := New(3)
	l.now = func() time.Time { return now }
	for i := range 3 {
		if !l.Allow("a") {
			t.Fatalf("event %d refused", i)
		}
	}
	if l.Allow("a") || !l.Blocked("a") {
		t.Fatal("4th event in the window allowed")
	}
	if !l.Allow("b") {
		t.Fatal("another key is limited too")
	}
	// In the middle of the next window half of the old events still
	// count (sliding): 1.5 of 3, so one more event fits, and a second.
	now = now.Add(Window + Window/2)
	n := 0
	for l.Allow("a") {
		n++
	}
	if n != 2 {
		t.Fatalf("sliding window: %d more events after 1.5 windows, want 2", n)
	}
	now = now.Add(3 * Window)
	if l.Blocked("a") || len(l.cur)+len(l.prev) != 0 {
		t.Fatalf("old keys not dropped: %v %v", l.cur, l.prev)
	}
}
