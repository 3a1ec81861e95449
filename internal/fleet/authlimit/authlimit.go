// Package authlimit counts events per key (a source address, an instance
// UID) in one-minute windows and says when a key went over its limit. It
// guards the checks that cost a database query: a source that failed to
// authenticate too often is refused before its next token is looked up.
//
// No goroutine: stale keys are dropped while counting, so the map holds at
// most the keys of the last two windows.
package authlimit

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// Window is the counting period.
const Window = time.Minute

// Limiter allows Limit events per key per Window.
type Limiter struct {
	limit int64
	now   func() time.Time

	mu      sync.Mutex
	start   time.Time
	cur     map[string]int64
	prev    map[string]int64
	elapsed float64
}

// New returns a limiter of limit events per key per minute.
func New(limit int64) *Limiter {
	return &Limiter{limit: limit, now: time.Now, cur: map[string]int64{}, prev: map[string]int64{}}
}

// roll advances the windows; the caller holds mu.
func (l *Limiter) roll(now time.Time) {
	switch d := now.Sub(l.start); {
	case d >= 2*Window:
		l.start, l.prev, l.cur = now, map[string]int64{}, map[string]int64{}
	case d >= Window:
		l.start, l.prev, l.cur = l.start.Add(Window), l.cur, map[string]int64{}
	}
	l.elapsed = float64(now.Sub(l.start)) / float64(Window)
}

// count is the sliding-window estimate of key's events; the caller holds mu.
func (l *Limiter) count(key string) float64 {
	return float64(l.prev[key])*(1-l.elapsed) + float64(l.cur[key])
}

// Blocked reports whether key used up its limit; it does not count.
func (l *Limiter) Blocked(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.roll(l.now())
	return l.count(key) >= float64(l.limit)
}

// Add counts one event of key.
func (l *Limiter) Add(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.roll(l.now())
	l.cur[key]++
}

// Allow counts one event of key and reports whether it was within the
// limit; an event over the limit is not counted.
func (l *Limiter) Allow(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.roll(l.now())
	if l.count(key) >= float64(l.limit) {
		return false
	}
	l.cur[key]++
	return true
}

// Source is the key of a request's source: the remote IP address (without
// the port, so that new connections do not reset it). Forwarded headers
// are not trusted: they are set by the caller.
func Source(r *http.Request) string {
	h, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return h
}

// RetryAfter is the Retry-After value, in seconds, sent with a refusal.
const RetryAfter = "60"
