package authlimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// valid is the check of a store that knows one credential.
func valid(cred string) func(string) func(context.Context) (bool, error) {
	return func(tok string) func(context.Context) (bool, error) {
		return func(context.Context) (bool, error) { return tok == cred, nil }
	}
}

// TestGuardSlowsGuessingNotTheValid: 30 failures from one address, then a
// valid credential from the same address is accepted (old code: the
// Limiter refused the whole address for a minute), one that worked before
// skips the slow lane, and the guesses after the limit are answered
// ErrSlowedDown one at a time.
func TestGuardSlowsGuessingNotTheValid(t *testing.T) {
	g := NewGuard(30, 50*time.Millisecond)
	check := valid("good")
	ctx := context.Background()
	if ok, err := g.Check(ctx, "10.0.0.1", "known", func(context.Context) (bool, error) { return true, nil }); !ok || err != nil {
		t.Fatal(ok, err)
	}
	for i := range 30 {
		if ok, err := g.Check(ctx, "10.0.0.1", fmt.Sprint("guess", i), check(fmt.Sprint("guess", i))); ok || err != nil {
			t.Fatalf("guess %d: %v %v", i, ok, err)
		}
	}
	if !g.Slowed("10.0.0.1") {
		t.Fatal("30 failures did not slow the source")
	}
	if ok, err := g.Check(ctx, "10.0.0.1", "guess-more", check("guess-more")); ok || !errors.Is(err, ErrSlowedDown) {
		t.Fatalf("31st guess: %v %v, want ErrSlowedDown", ok, err)
	}
	if ok, err := g.Check(ctx, "10.0.0.1", "good", check("good")); !ok || err != nil {
		t.Fatalf("valid credential from a slowed source: %v %v", ok, err)
	}
	if ok, err := g.Check(ctx, "10.0.0.2", "x", check("x")); ok || err != nil {
		t.Fatalf("another source: %v %v", ok, err)
	}

	// Concurrent guesses from the slowed source run one at a time.
	var inFlight, most atomic.Int64
	slowCheck := func(context.Context) (bool, error) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(time.Millisecond)
		return false, nil
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { g.Check(ctx, "10.0.0.1", "g", slowCheck) })
	}
	// Meanwhile a credential that worked before is not held up by them
	// (it would wait up to 8 penalties in the lane).
	known := make(chan bool, 1)
	go func() {
		var ran atomic.Bool
		ok, _ := g.Check(ctx, "10.0.0.1", "known", func(context.Context) (bool, error) { ran.Store(true); return true, nil })
		known <- ok && ran.Load()
	}()
	if !<-known {
		t.Fatal("a known credential was not checked and accepted")
	}
	wg.Wait()
	if most.Load() != 1 {
		t.Fatalf("%d checks of a slowed source in flight at once, want 1", most.Load())
	}
	if len(g.lanes) != 0 {
		t.Fatalf("lanes left behind: %v", g.lanes)
	}

	// A deadline that ends while waiting for the lane: ErrSlowedDown,
	// without a check.
	g.enter("10.0.0.1").slot <- struct{}{}
	dctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := g.Check(dctx, "10.0.0.1", "fresh", func(context.Context) (bool, error) { t.Error("checked"); return true, nil }); !errors.Is(err, ErrSlowedDown) {
		t.Fatalf("waiting past the deadline: %v", err)
	}
}

// An unavailable check is not a failure.
func TestGuardErrorIsNotAFailure(t *testing.T) {
	g := NewGuard(2, time.Millisecond)
	boom := errors.New("db down")
	for range 5 {
		if _, err := g.Check(context.Background(), "a", "t", func(context.Context) (bool, error) { return false, boom }); !errors.Is(err, boom) {
			t.Fatal(err)
		}
	}
	if g.Slowed("a") {
		t.Fatal("errors counted as failures")
	}
	if g.RetryAfter() != "1" || NewGuard(1, 2500*time.Millisecond).RetryAfter() != "3" {
		t.Fatal("RetryAfter rounds up to whole seconds")
	}
}

func TestProxiesSource(t *testing.T) {
	p, err := ParseProxies("10.1.0.0/16, 192.0.2.7,::1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseProxies("10.0.0.0/8,nonsense"); err == nil {
		t.Fatal("nonsense accepted")
	}
	req := func(peer string, xff ...string) *http.Request {
		r, _ := http.NewRequest("GET", "/", nil)
		r.RemoteAddr = peer
		for _, v := range xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		return r
	}
	for _, c := range []struct {
		r    *http.Request
		want string
	}{
		{req("198.51.100.9:4000", "203.0.113.5"), "198.51.100.9"},                // untrusted peer: header ignored
		{req("10.1.2.3:4000", "203.0.113.5"), "203.0.113.5"},                     // nginx
		{req("10.1.2.3:4000"), "10.1.2.3"},                                       // a trusted peer without header is the source
		{req("10.1.2.3:4000", "6.6.6.6, 203.0.113.5, 192.0.2.7"), "203.0.113.5"}, // two proxies; the client's own entry is ignored
		{req("10.1.2.3:4000", "6.6.6.6", "203.0.113.5"), "203.0.113.5"},          // several header lines
		{req("10.1.2.3:4000", "garbage, 10.1.9.9"), "10.1.9.9"},                  // unparsable: last good hop
		{req("[::1]:4000", "2001:db8::1"), "2001:db8::1"},                        // IPv6
		{req("10.1.2.3:4000", "[2001:db8::2]:555"), "2001:db8::2"},               // with port
		{req("[::ffff:10.1.2.3]:4000", "203.0.113.6"), "203.0.113.6"},            // v4-mapped peer
	} {
		if got := p.Source(c.r); got != c.want {
			t.Errorf("peer %s XFF %v: source %s, want %s", c.r.RemoteAddr, c.r.Header.Values("X-Forwarded-For"), got, c.want)
		}
	}
	var none *Proxies
	if none.Source(req("10.1.2.3:4000", "203.0.113.5")) != "10.1.2.3" {
		t.Fatal("nil Proxies trusts a header")
	}
}
