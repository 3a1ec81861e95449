package lease

import (
	"context"
	"testing"
	"time"
)

// BenchmarkValid is the cost of one point-of-action check: a context
// check, an atomic load and one read of the owner clock (CLOCK_BOOTTIME on Linux,
// through the vDSO where it has one). "system-clock" is time.Now for
// comparison; BenchmarkBootTimeSyscall is the clock read by the system
// call alone (the fallback).
func BenchmarkValid(b *testing.B) {
	for _, c := range []struct {
		name  string
		clock Clock
	}{{"boottime", defaultOwnerClock()}, {"system-clock", SystemClock{}}} {
		b.Run(c.name, func(b *testing.B) {
			o := newOwnership(context.Background(), Token{Version: 1, Owner: "o"}, c.clock, c.clock.Now().Add(time.Hour))
			defer o.end(context.Canceled)
			for b.Loop() {
				if !o.Valid() {
					b.Fatal("invalid")
				}
			}
		})
	}
}
