package opampserver

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// rssMiB is this process's resident memory in MiB (VmRSS).
func rssMiB(t *testing.T) float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

func heapMiB() float64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapInuse) / (1 << 20)
}

// chunk is what the clients send, shared so that the clients' own memory
// does not count.
var chunk = make([]byte, 64<<10)

// slowBodies opens n connections that declare a 4 MiB body, send all of
// it but the last KiB at once and then one byte a second: the attack of
// issue 21 item 2. hdr(i) are the extra header lines of connection i.
// It returns the connections still open after hold and stops them.
func slowBodies(t *testing.T, addr string, n int, hold time.Duration, hdr func(i int) string, during func()) (open int, rss, heap float64) {
	const size = 4 << 20
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	closed := 0
	var conns []net.Conn
	for i := range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		fmt.Fprintf(c, "POST /v1/opamp HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n", size, hdr(i))
		wg.Go(func() {
			// Reads until the server answers or closes.
			c.SetReadDeadline(time.Now().Add(hold + time.Minute))
			io.Copy(io.Discard, c)
			mu.Lock()
			closed++
			mu.Unlock()
		})
		wg.Go(func() {
			for left := size - 1024; left > 0; {
				n, err := c.Write(chunk[:min(left, len(chunk))])
				if err != nil {
					return
				}
				left -= n
			}
			tk := time.NewTicker(time.Second)
			defer tk.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tk.C:
					if _, err := c.Write([]byte{0}); err != nil {
						return
					}
				}
			}
		})
	}
	time.Sleep(hold)
	runtime.GC()
	rss, heap = rssMiB(t), heapMiB()
	during()
	mu.Lock()
	open = n - closed
	mu.Unlock()
	close(stop)
	for _, c := range conns {
		c.Close()
	}
	wg.Wait()
	return open, rss, heap
}

// headerOnly opens n connections that send the headers of a POST with a
// 4 MiB body and nothing else, and returns how long the server kept
// them: the longest time to its close, or max if some were still open.
func headerOnly(t *testing.T, addr string, n int, hdr string, max time.Duration) time.Duration {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var longest time.Duration
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		fmt.Fprintf(c, "POST /v1/opamp HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n", 4<<20, hdr)
		wg.Go(func() {
			c.SetReadDeadline(start.Add(max))
			br := bufio.NewReader(c)
			_, err := io.Copy(io.Discard, br)
			d := time.Since(start)
			if err != nil {
				d = max
			}
			mu.Lock()
			longest = maxDur(longest, d)
			mu.Unlock()
		})
	}
	wg.Wait()
	return longest
}

func maxDur(a, b time.Duration) time.Duration {
	if a > b {
		return a
	}
	return b
}

// TestMeasureSlowBodies is a measurement, not a check (issue 21 item 2):
// the resident memory of this process (server and clients) with 100
// connections that declare 4 MiB bodies and trickle the last KiB, without
// and with a valid Authorization (the secret), from one address and from
// 100 addresses (X-Forwarded-For through a trusted proxy); and how long
// the server keeps connections that send only headers. Run:
//
//	MYRIARCH_MEASURE=1 go test -run TestMeasureSlowBodies -v ./internal/fleet/opampserver/
func TestMeasureSlowBodies(t *testing.T) {
	if os.Getenv("MYRIARCH_MEASURE") == "" {
		t.Skip("a measurement; set MYRIARCH_MEASURE=1")
	}
	debug.FreeOSMemory()
	const hold = 10 * time.Second
	for _, c := range []struct {
		name string
		hdr  func(i int) string
	}{
		{"no Authorization", func(int) string { return "" }},
		{"wrong secret", func(int) string { return "Authorization: Bearer wrong-secret\r\n" }},
		{"valid secret, one address", func(int) string { return "Authorization: Bearer " + secret + "\r\n" }},
		{"valid secret, 100 addresses", func(i int) string {
			return fmt.Sprintf("Authorization: Bearer %s\r\nX-Forwarded-For: 198.51.100.%d\r\n", secret, i+1)
		}},
	} {
		s := guarded(t, nil, measureOptions(t))
		debug.FreeOSMemory()
		base := rssMiB(t)
		var charged int64
		open, rss, heap := slowBodies(t, s.Addr().String(), 100, hold, c.hdr, func() { charged, _ = s.guard.inFlight("") })
		t.Logf("MEASURE 100 slow 4 MiB bodies, %s: RSS %.0f MiB before, %.0f MiB after %v (Go heap in use %.0f MiB); %d of 100 connections still open",
			c.name, base, rss, hold, heap, open)
		var refused []string
		for _, r := range []string{"slowed", "body_timeout", "source_budget", "listener_budget", "unauthenticated", "too_large"} {
			if n := testutil.ToFloat64(s.guard.mRefused.WithLabelValues(r)); n > 0 {
				refused = append(refused, fmt.Sprintf("%s %.0f", r, n))
			}
		}
		t.Logf("MEASURE   body bytes charged then: %.1f MiB; refused: %s", float64(charged)/(1<<20), strings.Join(refused, ", "))
		debug.FreeOSMemory()
	}
	s := guarded(t, nil, measureOptions(t))
	t.Logf("MEASURE 20 header-only connections without Authorization: closed by the server after at most %v",
		headerOnly(t, s.Addr().String(), 20, "", time.Minute).Round(10*time.Millisecond))
	t.Logf("MEASURE 20 header-only connections with the secret: closed by the server after at most %v",
		headerOnly(t, s.Addr().String(), 20, "Authorization: Bearer "+secret+"\r\n", time.Minute).Round(10*time.Millisecond))
}

// measureOptions: the defaults, with this test's address as a trusted
// proxy (for the 100-address case).
func measureOptions(t *testing.T) Options {
	return Options{Listener: ListenerLimits{Proxies: mustProxies(t, "127.0.0.1")}}
}
