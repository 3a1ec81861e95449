package runtime_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/runtime"
	"github.com/myriarch/myriarch/internal/testwait"
	"github.com/myriarch/myriarch/lease"
)

// slowSink is a stamp sink whose every POST takes delay, so that an owner
// always has messages in flight; block, when set, holds every POST until
// it is closed.
type slowSink struct {
	stampSink
	delay time.Duration
	block chan struct{}
}

func newSlowSink(t *testing.T, delay time.Duration, block chan struct{}) *slowSink {
	s := &slowSink{delay: delay, block: block}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if s.block != nil {
			select {
			case <-s.block:
			case <-r.Context().Done():
				return
			}
		}
		time.Sleep(s.delay)
		s.mu.Lock()
		s.got = append(s.got, delivery{string(b), r.Header.Get(fence.HeaderLeaseVersion), r.Header.Get(fence.HeaderSessionID), time.Now()})
		s.mu.Unlock()
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// releases records when each lease version was released by this instance.
type releases struct {
	mu sync.Mutex
	at map[int64]time.Time
}

func (r *releases) add(_ string, e lease.Event) {
	if e.Kind != lease.EventReleased || e.Err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.at == nil {
		r.at = map[int64]time.Time{}
	}
	// The manager's time of the release, not the callback's: the callback
	// runs on the runtime's event goroutine, which a loaded machine may
	// schedule after the successor has already delivered.
	r.at[e.Token.Version] = e.Time
}

func (r *releases) of(v int64) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.at[v]
	return t, ok
}

// plannedTemplate settles for up to 3s (step_down_grace) and sends one
// message at a time (max_in_flight 4), so that a stop always finds work in
// flight.
var plannedTemplate = strings.NewReplacer("    step_down_grace: 1s\n", "    step_down_grace: 3s\n    max_in_flight: 4\n",
	"shutdown_timeout: 5s", "shutdown_timeout: 20s").Replace(cfgTemplate)

// A planned stop (the process's context ends, as on SIGTERM) settles what
// the owner holds before it releases the lease: every message it started
// is delivered and acknowledged at the source, so the successor delivers
// each remaining message once, nothing twice, nothing lost, and the old
// owner's last delivery comes before its release.
func TestPlannedStopSettlesBeforeRelease(t *testing.T) {
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	dir := t.TempDir()
	sk := newSlowSink(t, 20*time.Millisecond, nil)
	relA := &releases{}
	a := startWith(t, plannedTemplate, dir, "a", br.URL, sk.srv.URL, runtime.Options{OnLeaseEvent: relA.add})
	testwait.Until(t, "a owns and serves", waitLimit, func() bool { return role(a) == "owner/full" })
	bb := startWith(t, plannedTemplate, dir, "b", br.URL, sk.srv.URL, runtime.Options{})
	testwait.Until(t, "b standby", waitLimit, func() bool { return role(bb) == "standby/none" })
	p := publisher(t, br.URL)
	const n = 150
	pub(t, p, 0, n)
	testwait.Until(t, "a delivers", waitLimit, func() bool { return len(sk.deliveries()) >= 10 })

	stopAt := time.Now()
	a.cancel()
	if err := <-a.done; err != nil {
		t.Fatalf("planned stop: %v", err)
	}
	a.done <- nil
	released, ok := relA.of(1)
	if !ok {
		t.Fatal("a's planned stop did not release lease version 1")
	}
	testwait.Until(t, "b owns and serves", waitLimit, func() bool { return role(bb) == "owner/full" })
	testwait.Until(t, "all delivered", waitLimit, func() bool { return len(sk.deliveries()) >= n })
	time.Sleep(500 * time.Millisecond) // room for a late duplicate to show

	seen := map[string]int{}
	var lastA, firstB time.Time
	afterStop := 0
	for _, d := range sk.deliveries() {
		seen[d.payload]++
		switch d.version {
		case "1":
			lastA = d.at
			if d.at.After(stopAt) {
				afterStop++
			}
		case "2":
			if firstB.IsZero() {
				firstB = d.at
			}
		default:
			t.Fatalf("delivery %+v: want lease version 1 (a) or 2 (b)", d)
		}
	}
	for i := range n {
		if c := seen[fmt.Sprint(i)]; c != 1 {
			t.Errorf("message %d delivered %d times, want once", i, c)
		}
	}
	if afterStop == 0 {
		t.Error("a had nothing in flight when it was stopped: the test proves nothing")
	}
	if lastA.After(released) {
		t.Errorf("a's last delivery %v after its release", lastA.Sub(released))
	}
	if firstB.IsZero() || firstB.Before(released) {
		t.Errorf("b's first delivery at %v, a released at %v", firstB, released)
	}
	t.Logf("a settled %d deliveries after the stop; release %v after the stop, %v after a's last delivery; b's first delivery %v after a's last",
		afterStop, released.Sub(stopAt).Round(time.Millisecond), released.Sub(lastA).Round(time.Millisecond), firstB.Sub(lastA).Round(time.Millisecond))
}

// cutTemplate settles for up to 30s (step_down_grace) but gives the whole
// stop 1s (shutdown_timeout).
var cutTemplate = strings.NewReplacer("    lease_ttl: 5s\n", "    lease_ttl: 120s\n    renew_interval: 30s\n",
	"    step_down_grace: 1s\n", "    step_down_grace: 30s\n", "failover_slo: 60s", "failover_slo: 600s",
	"shutdown_timeout: 5s", "shutdown_timeout: 1s").Replace(cfgTemplate)

// A planned stop whose in-flight messages cannot settle (the destination
// hangs) is cut at shutdown_timeout, not at the longer step_down_grace:
// the lease is released, and the successor delivers what was left
// unacknowledged.
func TestPlannedStopCutAtShutdownTimeout(t *testing.T) {
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	dir := t.TempDir()
	block := make(chan struct{})
	sk := newSlowSink(t, 0, block)
	var arrivals sync.WaitGroup
	arrivals.Add(1)
	var once sync.Once
	inner := sk.srv.Config.Handler
	sk.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(arrivals.Done)
		inner.ServeHTTP(w, r)
	})
	relA := &releases{}
	a := startWith(t, cutTemplate, dir, "a", br.URL, sk.srv.URL, runtime.Options{OnLeaseEvent: relA.add})
	testwait.Until(t, "a owns and serves", waitLimit, func() bool { return role(a) == "owner/full" })
	bb := startWith(t, cutTemplate, dir, "b", br.URL, sk.srv.URL, runtime.Options{})
	testwait.Until(t, "b standby", waitLimit, func() bool { return role(bb) == "standby/none" })
	p := publisher(t, br.URL)
	pub(t, p, 0, 5)
	arrivals.Wait() // a's first POST hangs at the sink

	stopAt := time.Now()
	a.cancel()
	select {
	case err := <-a.done:
		a.done <- err
	case <-time.After(20 * time.Second):
		t.Fatal("a's stop was not cut at shutdown_timeout (1s): it waited for step_down_grace (30s)")
	}
	if _, ok := relA.of(1); !ok {
		t.Fatal("a did not release its lease")
	}
	t.Logf("a stopped %v after the stop began (shutdown_timeout 1s, step_down_grace 30s)", time.Since(stopAt).Round(time.Millisecond))
	close(block)
	testwait.Until(t, "b owns and serves", waitLimit, func() bool { return role(bb) == "owner/full" })
	testwait.Until(t, "b delivers all 5", waitLimit, func() bool {
		got := map[string]bool{}
		for _, d := range sk.deliveries() {
			if d.version == "2" {
				got[d.payload] = true
			}
		}
		return len(got) == 5
	})
}
