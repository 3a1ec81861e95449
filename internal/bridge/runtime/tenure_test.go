package runtime_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/runtime"
	"github.com/myriarch/myriarch/internal/testnet"
	"github.com/myriarch/myriarch/internal/testwait"
	"github.com/myriarch/myriarch/lease"
)

// delivery is one POST the stamp sink received.
type delivery struct {
	payload, version, session string
	at                        time.Time
}

// stampSink is an HTTP destination that records every delivery with its
// fencing stamp, in arrival order.
type stampSink struct {
	mu  sync.Mutex
	got []delivery
	srv *httptest.Server
}

func newStampSink(t *testing.T) *stampSink {
	s := &stampSink{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.got = append(s.got, delivery{string(b), r.Header.Get(fence.HeaderLeaseVersion), r.Header.Get(fence.HeaderSessionID), time.Now()})
		s.mu.Unlock()
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *stampSink) deliveries() []delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]delivery(nil), s.got...)
}

// connectWatch records every session the broker establishes, per client id.
type connectWatch struct {
	mochi.HookBase
	mu  sync.Mutex
	log []connectEvent
}

type connectEvent struct {
	clientID string
	at       time.Time
}

func (w *connectWatch) ID() string { return "connect-watch" }
func (w *connectWatch) Provides(b byte) bool {
	return b == mochi.OnSessionEstablished
}
func (w *connectWatch) OnSessionEstablished(cl *mochi.Client, _ packets.Packet) {
	w.mu.Lock()
	w.log = append(w.log, connectEvent{cl.ID, time.Now()})
	w.mu.Unlock()
}

// since returns the sessions established for clientID at or after t.
func (w *connectWatch) since(clientID string, t time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, e := range w.log {
		if e.clientID == clientID && !e.at.Before(t) {
			n++
		}
	}
	return n
}

// startWith starts one instance of yaml (with INSTANCE, DIR, BROKER and
// SINK replaced) with opts.
func startWith(t *testing.T, yaml, dir, id, broker, sinkURL string, opts runtime.Options) *instance {
	t.Helper()
	y := strings.NewReplacer("INSTANCE", id, "DIR", dir, "BROKER", broker, "SINK", sinkURL).Replace(yaml)
	cfg, err := config.Parse(filepath.Join(dir, id+".yaml"), []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("test_instance", id)
	}
	b, err := runtime.New(context.Background(), cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{b: b, cancel: cancel, done: make(chan error, 1), reg: reg}
	go func() { in.done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-in.done:
			in.done <- err
		case <-time.After(20 * time.Second):
			t.Error("bridge did not stop")
		}
	})
	return in
}

// freezeTemplate is cfgTemplate with a long lease: the Go timers of the
// tenure (watchdog, renew round) fire only tens of seconds after the
// deadline clock jumped, which is what a host suspend looks like.
var freezeTemplate = strings.NewReplacer("    lease_ttl: 5s\n", "    lease_ttl: 120s\n    renew_interval: 30s\n", "failover_slo: 60s", "failover_slo: 600s").Replace(cfgTemplate)

// An owner frozen through its lease deadline (its deadline clock jumped,
// as CLOCK_BOOTTIME does across a host suspend, while Go's monotonic
// timers have not fired) does not act on resuming: no message reaches the
// sink from it, nothing is acknowledged, and when its broker connection
// drops it does not reconnect with the session's client_id (which would
// kick a successor off the broker session).
func TestFrozenOwnerDoesNotActPastItsDeadline(t *testing.T) {
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	watch := &connectWatch{}
	if err := br.Server.AddHook(watch, nil); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sk := newStampSink(t)
	clk := &lease.JumpClock{}
	a := startWith(t, freezeTemplate, dir, "a", br.URL, sk.srv.URL, runtime.Options{Clock: clk})
	testwait.Until(t, "a owns and serves", waitLimit, func() bool { return role(a) == "owner/full" })
	p := publisher(t, br.URL)
	pub(t, p, 0, 10)
	testwait.Until(t, "first 10 delivered", waitLimit, func() bool { return len(sk.deliveries()) >= 10 })
	for _, d := range sk.deliveries() {
		if d.version != "1" || d.session != "t/plant" {
			t.Fatalf("delivery %+v: want lease version 1 of session t/plant", d)
		}
	}

	// Freeze through the deadline, then resume: the deadline clock is past
	// the deadline, the Go timers are not.
	clk.Jump(2 * time.Minute)
	frozenAt := time.Now()
	before := len(sk.deliveries())
	pub(t, p, 10, 20)
	// The broker drops the owner's connection (a successor taking the
	// client_id over, a network blip).
	cl, ok := br.Server.Clients.Get("plant-bridge")
	if !ok {
		t.Fatal("the owner's client is not connected")
	}
	cl.Stop(errors.New("test: connection dropped"))
	// Well above the transport's reconnect backoff (100ms) and the
	// sender's pipeline: a live owner would have reconnected and
	// delivered by now.
	time.Sleep(3 * time.Second)
	if got := sk.deliveries()[before:]; len(got) > 0 {
		t.Errorf("the owner delivered %d message(s) after its deadline, first %+v", len(got), got[0])
	}
	if n := watch.since("plant-bridge", frozenAt); n > 0 {
		t.Errorf("the owner reconnected %d time(s) with the session's client_id after its deadline", n)
	}
}

// An instance that wins the lease but never reaches its broker (here: a
// port nobody listens on) releases the lease after broker_health_step_down
// plus one detection round, like an owner that lost its path; the
// instance that can reach the broker takes over and serves.
func TestUnreachableBrokerOwnerReleases(t *testing.T) {
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	dead := testnet.DeadAddr(t)
	dir := t.TempDir()
	sk := newStampSink(t)
	a := startWith(t, cfgTemplate, dir, "a", "tcp://"+dead, sk.srv.URL, runtime.Options{})
	testwait.Until(t, "a owns", waitLimit, func() bool { return strings.HasPrefix(role(a), "owner/") })
	ownedAt := time.Now()
	bb := startWith(t, cfgTemplate, dir, "b", br.URL, sk.srv.URL, runtime.Options{})
	var runErr error
	select {
	case runErr = <-a.done:
		a.done <- runErr
	case <-time.After(60 * time.Second):
		t.Fatalf("the owner that cannot reach its broker kept the lease (role %s)", role(a))
	}
	released := time.Since(ownedAt)
	if !errors.Is(runErr, lease.ErrDependencyStepDown) {
		t.Fatalf("owner returned %v, want the terminal broker-path step-down", runErr)
	}
	if released < 2*time.Second {
		t.Fatalf("released %v after winning, before broker_health_step_down (2s)", released)
	}
	testwait.Until(t, "b owns and serves", waitLimit, func() bool { return role(bb) == "owner/full" })
	served := time.Since(ownedAt)
	budget := bb.b.Status().Sessions[0].Budget
	if budget == nil || budget.BrokerPathBudget == nil {
		t.Fatalf("no broker-path budget disclosed: %+v", budget)
	}
	t.Logf("unreachable owner released %v after winning the lease; the other instance served %v after (broker-path budget %vs)",
		released.Round(time.Millisecond), served.Round(time.Millisecond), *budget.BrokerPathBudget)
	if served.Seconds() > *budget.BrokerPathBudget {
		t.Fatalf("served %v after the unreachable owner won, beyond the broker-path budget %vs", served, *budget.BrokerPathBudget)
	}
	p := publisher(t, br.URL)
	pub(t, p, 0, 5)
	testwait.Until(t, "5 delivered by b", waitLimit, func() bool { return len(sk.deliveries()) >= 5 })
	for _, d := range sk.deliveries() {
		if d.version != "2" {
			t.Fatalf("delivery %+v: want b's lease version 2", d)
		}
	}
}
