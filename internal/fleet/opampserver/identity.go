package opampserver

import (
	"math"
	"strconv"
	"sync"
	"time"
)

// Refusing before the upgrade
//
// With the enrollment secret the instance UID is known only from the
// first message, after the WebSocket upgrade. A connection refused then
// (a revoked agent, a UID over its reconnect limit, the enrollment rate
// limit) is closed, and the stock opamp-go client takes a closed
// connection as a success followed by a drop: it reconnects at once,
// without backoff (~925 reconnects/s of one revoked agent). Its backoff
// runs only when the upgrade itself fails, and it honours Retry-After
// only with 429 or 503 (opamp-go internal/retryafter.go). So the source
// address of a refused secret connection is remembered for
// Options.SecretBackoff, and further connections with the secret from it
// get 429 with Retry-After before the upgrade. Credentials and client
// certificates from that source still pass: agents behind the same NAT
// that hold credentials are not affected. Agents there that connect with
// the secret (new ones, or ones that never take a credential) wait too:
// the UID is not known before the upgrade, so the source is all there is
// to key on (a trade-off stated in docs/myriarchd.md, "Agent identity").

// sourceBackoff remembers sources whose secret connections are refused
// before the upgrade until a deadline.
type sourceBackoff struct {
	mu    sync.Mutex
	until map[string]time.Time
}

// maxBackoffSources bounds the memory of sourceBackoff; past it, expired
// entries are dropped, and if none expired the new source is not
// remembered (it is then refused after the upgrade, as before).
const maxBackoffSources = 100000

func (b *sourceBackoff) add(src string, now time.Time, d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.until == nil {
		b.until = map[string]time.Time{}
	}
	if len(b.until) >= maxBackoffSources {
		for k, t := range b.until {
			if !now.Before(t) {
				delete(b.until, k)
			}
		}
		if len(b.until) >= maxBackoffSources {
			return
		}
	}
	b.until[src] = now.Add(d)
}

// wait is how long src is still refused; 0 when it is not.
func (b *sourceBackoff) wait(src string, now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.until[src]
	if !ok {
		return 0
	}
	if !now.Before(t) {
		delete(b.until, src)
		return 0
	}
	return t.Sub(now)
}

// retryAfter is the Retry-After value of a wait: whole seconds, at least 1.
func retryAfter(d time.Duration) string {
	return strconv.Itoa(max(1, int(math.Ceil(d.Seconds()))))
}

// stormLog lets a repeated refusal be logged (and recorded as an event)
// once per interval per key, with the count of the ones in between: a
// storm costs a line a minute, not 3.95 MB of lines in 10 s.
type stormLog struct {
	interval time.Duration
	mu       sync.Mutex
	m        map[string]*stormEntry
}

type stormEntry struct {
	last  time.Time
	count int
}

// hit counts one occurrence of key and reports whether to log it now, and
// how many occurrences that line stands for (this one included).
func (l *stormLog) hit(key string, now time.Time) (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]*stormEntry{}
	}
	e := l.m[key]
	if e == nil {
		if len(l.m) >= maxBackoffSources {
			for k, x := range l.m {
				if now.Sub(x.last) >= l.interval {
					delete(l.m, k)
				}
			}
		}
		l.m[key] = &stormEntry{last: now}
		return 1, true
	}
	e.count++
	if now.Sub(e.last) < l.interval {
		return 0, false
	}
	n := e.count
	e.last, e.count = now, 0
	return n, true
}
