// Package testwait is the tests' one way to wait for a condition: it
// polls, and the limit is the test's. Tests of every part use it (bridge,
// fleet through fleettest.Eventually, the libraries), so it depends on
// nothing of the module.
package testwait

import (
	"testing"
	"time"
)

// Polling: the first checks come quickly (a condition that holds almost at
// once costs the test almost nothing), then every maxPoll, so that a
// condition that queries a database costs at most 50 queries a second.
const (
	firstPoll = 5 * time.Millisecond
	maxPoll   = 20 * time.Millisecond
)

// Eventually reports whether cond holds within limit; the test decides
// what a false means.
func Eventually(limit time.Duration, cond func() bool) bool {
	_, ok := wait(limit, cond)
	return ok
}

// Until returns once cond holds, with how long that took; if it does not
// hold within limit, the test fails, naming what it waited for.
func Until(t testing.TB, what string, limit time.Duration, cond func() bool) time.Duration {
	t.Helper()
	took, ok := wait(limit, cond)
	if !ok {
		t.Fatalf("%s: not within %v", what, limit)
	}
	return took
}

func wait(limit time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	poll := firstPoll
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > limit {
			return 0, false
		}
		time.Sleep(poll)
		poll = min(2*poll, maxPoll)
	}
}
