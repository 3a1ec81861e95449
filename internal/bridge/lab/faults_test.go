package lab

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A delivery stamped with a lease version the store's history never showed
// granted is a stamp no lease backs: the round it falls in fails, and
// rounds whose stamps the store granted do not.
func TestCheckStampsAgainstTheStoreHistory(t *testing.T) {
	t0 := time.Now()
	rs := []Result{{Round: 0, start: t0}, {Round: 1, start: t0.Add(10 * time.Second)}}
	ds := []delivery{
		{At: t0.Add(time.Second), Seq: 0, Version: 1},
		{At: t0.Add(2 * time.Second), Seq: 1, Version: 2},
		{At: t0.Add(11 * time.Second), Seq: 2, Version: 7},
		{At: t0.Add(12 * time.Second), Seq: 3, Version: 7},
		{At: t0.Add(13 * time.Second), Seq: 4, Version: 0},
	}
	changes := []change{{Owner: "a#1", Version: 1}, {Owner: "", Version: 1}, {Owner: "b#1", Version: 2}, {Owner: "", Version: 7}}
	checkStamps(rs, ds, changes)
	if len(rs[0].Problems) != 0 {
		t.Errorf("round 0: %q", rs[0].Problems)
	}
	if len(rs[1].Problems) != 1 || !strings.Contains(rs[1].Problems[0], "2 deliveries stamped with lease version 7, which the store's history never showed granted") {
		t.Errorf("round 1: %q", rs[1].Problems)
	}
}

func TestNeedsStorePath(t *testing.T) {
	for sc, want := range map[string]bool{OwnerSIGKILL: false, OwnerStorePartition: true, OwnerStoreFreeze: true, OwnerBothPathsDown: true,
		OwnerSIGKILLStandbyStoreBlip: true, OwnerSIGKILLStandbyBrokerRefused: false, OwnerBrokerUnreachable: false} {
		if NeedsStorePath(sc) != want {
			t.Errorf("NeedsStorePath(%s) = %t", sc, !want)
		}
	}
}

// A second fault's start and end run on timers that stop() cancels or
// waits for: none runs after it returns.
func TestExtraFaultTimersStop(t *testing.T) {
	var x extraFaults
	var fired, late atomic.Int32
	x.after(0, func() {
		fired.Add(1)
		x.after(20*time.Millisecond, func() { fired.Add(1) })
	})
	x.after(time.Hour, func() { late.Add(1) })
	time.Sleep(5 * time.Millisecond)
	x.stop()
	n := fired.Load()
	time.Sleep(50 * time.Millisecond)
	if fired.Load() != n || late.Load() != 0 {
		t.Errorf("timers ran after stop: fired %d then %d, late %d", n, fired.Load(), late.Load())
	}
}

// A chain of timers (the starvation fault re-arms itself every cycle)
// ends at stop: a timer that fires while stop runs schedules nothing.
func TestExtraFaultChainEndsAtStop(t *testing.T) {
	var x extraFaults
	var ticks atomic.Int32
	var step func()
	step = func() {
		ticks.Add(1)
		x.after(time.Millisecond, step)
	}
	x.after(0, step)
	time.Sleep(20 * time.Millisecond)
	done := make(chan struct{})
	go func() { x.stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("stop did not return: the chain kept re-arming")
	}
	n := ticks.Load()
	time.Sleep(30 * time.Millisecond)
	if ticks.Load() != n {
		t.Errorf("the chain ran on after stop: %d ticks, then %d", n, ticks.Load())
	}
	if n == 0 {
		t.Error("the chain never ran")
	}
}
