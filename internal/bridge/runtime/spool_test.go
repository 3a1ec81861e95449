package runtime_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/runtime"
	"github.com/myriarch/myriarch/internal/bridge/spool"
	"github.com/myriarch/myriarch/internal/testwait"
)

const spoolCfg = `
bridge:
  id: t
  instance_id: a
  shutdown_timeout: 2s
  http: {listen: "off"}
  dead_letter: {path: DIR/dl.jsonl}
sessions:
  - id: plant
    session_mode: persistent
    brokers: ["tcp://BROKER"]
    client_id: spool-bridge
    receive_maximum: 20
    keep_alive: 2s
    connect_timeout: 2s
    reconcile_timeout: 2s
    unmatched_grace: 1s
receivers:
  - {id: in, session: plant, topics: [{filter: "in/#", qos: 1}]}
senders:
  - {id: sink, type: http, http: {url: "SINK", timeout: 1s}, retry: {max_attempts: 1000000, initial_backoff: 10ms, max_backoff: 50ms}}
routes:
  - id: r
    receiver: in
    senders: [sink]
    max_in_flight: 5
SPOOL`

// outageSink is an HTTP destination that answers 503 while down.
type outageSink struct {
	down atomic.Bool
	mu   sync.Mutex
	seen map[string]int
	srv  *httptest.Server
}

func newOutageSink(t *testing.T) *outageSink {
	s := &outageSink{seen: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if s.down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		s.mu.Lock()
		s.seen[string(b)]++
		s.mu.Unlock()
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *outageSink) distinct() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

// TestSpoolOutlastsTheBrokerQueue: the destination is down while more
// messages arrive than mosquitto holds for the bridge's session (20 in
// flight, receive_maximum, and 100 queued,
// max_queued_messages 100). Without a spool the bridge holds
// max_in_flight and mosquitto drops the rest; with one, the bridge
// acknowledges each message once the spool holds it, and when the
// destination returns every message arrives.
func TestSpoolOutlastsTheBrokerQueue(t *testing.T) {
	const n = 400
	for _, withSpool := range []bool{false, true} {
		t.Run(fmt.Sprintf("spool=%t", withSpool), func(t *testing.T) {
			m, err := embroker.StartMosquittoWith(context.Background(), t.TempDir(),
				"persistence false\nlog_dest stderr\nlog_type error\nmax_queued_messages 100\nset_tcp_nodelay true\n", "allow_anonymous true\n")
			if err != nil {
				if os.Getenv("CI") != "true" && strings.Contains(err.Error(), "mosquitto") {
					t.Skip(err)
				}
				t.Fatal(err)
			}
			t.Cleanup(m.Close)
			dst := newOutageSink(t)
			dst.down.Store(true)
			dir := t.TempDir()
			sp := ""
			if withSpool {
				sp = "    spool: {max_messages: 100000, fsync_interval: 20ms}\n"
			}
			y := strings.NewReplacer("DIR", dir, "BROKER", m.Addr, "SINK", dst.srv.URL, "SPOOL", sp).Replace(spoolCfg)
			cfg, err := config.Parse(filepath.Join(dir, "b.yaml"), []byte(y))
			if err != nil {
				t.Fatal(err)
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
			b, err := runtime.New(context.Background(), cfg, runtime.Options{Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- b.Run(ctx) }()
			defer func() {
				cancel()
				select {
				case <-done:
				case <-time.After(20 * time.Second):
					t.Error("bridge did not stop")
				}
			}()
			testwait.Until(t, "the session at full service", waitLimit, func() bool { return b.Ready() })
			c := publisher(t, "tcp://"+m.Addr)
			// Paced (a publish waits for mosquitto's PUBACK, and 2ms more),
			// so that only the outage, not the rate, can overflow the
			// broker's buffer of 20 in flight and 100 queued.
			for i := range n {
				pub(t, c, i, i+1)
				time.Sleep(2 * time.Millisecond)
			}
			if withSpool {
				testwait.Until(t, "the spool holding every message", waitLimit, func() bool {
					s := b.Status().Sessions[0]
					return len(s.Spools) == 1 && s.Spools[0].Messages == n
				})
			} else {
				time.Sleep(500 * time.Millisecond)
			}
			dst.down.Store(false)
			if withSpool {
				testwait.Until(t, "every message delivered", waitLimit, func() bool { return dst.distinct() == n })
				testwait.Until(t, "the spool empty", waitLimit, func() bool { return b.Status().Sessions[0].Spools[0].Messages == 0 })
				return
			}
			// Without the spool: what mosquitto dropped never comes.
			time.Sleep(2 * time.Second)
			if got := dst.distinct(); got >= n {
				t.Fatalf("without a spool %d of %d arrived; mosquitto's queue of 10 should have dropped some", got, n)
			} else {
				t.Logf("without a spool: %d of %d delivered, %d lost at the broker", got, n, n-got)
			}
		})
	}
}

// logBuf is a log destination that tests read while the bridge writes.
type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// An owner whose spool directory another process holds (a frozen
// predecessor, or a second bridge configured with the same directory)
// waits for the lock without serving: it says so in its log, and serves
// once the lock is let go. Before, the wait was silent.
func TestSpoolLockWaitIsLogged(t *testing.T) {
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	dir := t.TempDir()
	sk := newSink(t)
	sdir := filepath.Join(dir, "spool")
	holder, err := spool.Open(context.Background(), spool.Options{Dir: sdir, MaxMessages: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	lb := &logBuf{}
	y := strings.Replace(cfgTemplate, "    failover_slo: 60s", "    failover_slo: 60s\n    spool: {dir: "+sdir+", max_messages: 100}", 1)
	a := startWith(t, y, dir, "a", br.URL, sk.srv.URL, runtime.Options{Logger: slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	testwait.Until(t, "the wait for the spool's lock is logged", waitLimit, func() bool {
		return strings.Contains(lb.String(), "waiting for the spool's lock")
	})
	if r := role(a); r == "owner/full" {
		t.Fatalf("serving while another process holds the spool: %s", r)
	}
	if err := holder.Close(); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, "a serves once the lock is let go", waitLimit, func() bool { return role(a) == "owner/full" })
}
