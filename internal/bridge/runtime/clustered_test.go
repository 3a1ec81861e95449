package runtime_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/health"
	"github.com/myriarch/myriarch/internal/bridge/runtime"
	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/internal/testnet"
	"github.com/myriarch/myriarch/internal/testwait"
	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/etcdstore"
	"github.com/myriarch/myriarch/lease/etcdtest"
	"github.com/myriarch/myriarch/lease/pgstore"
)

// childConfigEnv makes the test binary a bridge process (see TestMain):
// it runs the configuration file it names, with its HTTP endpoints, until
// it is killed.
const childConfigEnv = "MYRIARCH_RUNTIME_TEST_CHILD_CONFIG"

func runChild(path string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	data, err := os.ReadFile(path)
	if err != nil {
		log.Error("config", "err", err)
		return 1
	}
	cfg, err := config.Parse(path, data)
	if err != nil {
		log.Error("config", "err", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	reg := prometheus.NewRegistry()
	b, err := runtime.New(ctx, cfg, runtime.Options{Logger: log, Registerer: reg})
	if err != nil {
		log.Error("start", "err", err)
		return 1
	}
	srv, err := health.Listen(cfg.Bridge.HTTPListen, health.Handler(b, reg))
	if err != nil {
		log.Error("http", "err", err)
		return 1
	}
	defer srv.Shutdown(context.Background())
	// The parent learns the port that the kernel picked (listen
	// 127.0.0.1:0) from this file, written whole by a rename.
	if err := os.WriteFile(path+".addr.tmp", []byte(srv.Addr()), 0o600); err != nil {
		log.Error("http", "err", err)
		return 1
	}
	if err := os.Rename(path+".addr.tmp", path+".addr"); err != nil {
		log.Error("http", "err", err)
		return 1
	}
	if err := b.Run(ctx); err != nil {
		log.Error("run", "err", err)
		return 1
	}
	return 0
}

// clusteredTemplate is cfgTemplate in clustered mode on a shared store.
const clusteredTemplate = `
bridge:
  id: t
  instance_id: INSTANCE
  deployment_mode: clustered
  shutdown_timeout: 5s
  http: {listen: "HTTP"}
  dead_letter: {path: DIR/dl-INSTANCE.jsonl}
  state_dir: DIR/INSTANCE
stores:
  lease: STORE
sessions:
  - id: plant
    session_mode: exclusive
    brokers: ["BROKER"]
    client_id: plant-bridge
    keep_alive: 1s
    connect_timeout: 1s
    reconcile_timeout: 1s
    unmatched_grace: 1s
receivers:
  - {id: in, session: plant, topics: [{filter: "in/#", qos: 1}]}
senders:
  - {id: sink, type: http, http: {url: "SINK"}, retry: {max_attempts: 10, initial_backoff: 10ms}}
routes:
  - id: r
    receiver: in
    senders: [sink]
    lease_ttl: 5s
    step_down_grace: 1s
    broker_health_step_down: "off"
    failover_slo: 60s
`

func clusteredConfig(t *testing.T, dir, id, httpAddr, store, broker, sinkURL string) (string, *config.Config) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, id), 0o755); err != nil {
		t.Fatal(err)
	}
	y := strings.NewReplacer("INSTANCE", id, "HTTP", httpAddr, "DIR", dir, "STORE", store, "BROKER", broker, "SINK", sinkURL).Replace(clusteredTemplate)
	path := filepath.Join(dir, id+".yaml")
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(path, []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return path, cfg
}

// child is a bridge process running this test binary.
type child struct {
	cmd    *exec.Cmd
	addr   string
	stderr *bytes.Buffer
	mu     *sync.Mutex

	exited   atomic.Bool // its process has been reaped
	lastRole atomic.Value
}

// Its configuration listens on 127.0.0.1:0: a port picked by the parent
// and bound later by the child could be taken in between (by another
// package's test, or as an outgoing connection's local port).
func startChild(t *testing.T, cfgPath string) *child {
	t.Helper()
	c := &child{stderr: &bytes.Buffer{}, mu: &sync.Mutex{}}
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), childConfigEnv+"="+cfgPath)
	c.cmd.Stderr = lockedWriter{c.mu, c.stderr}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			_ = c.cmd.Process.Kill()
			_ = c.cmd.Wait()
		}
		if t.Failed() {
			c.mu.Lock()
			t.Logf("child %s stderr:\n%s", cfgPath, c.stderr.String())
			c.mu.Unlock()
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(cfgPath + ".addr"); err == nil {
			c.addr = string(b)
			break
		}
		if time.Now().After(deadline) {
			c.mu.Lock()
			defer c.mu.Unlock()
			t.Fatalf("child %s did not report its HTTP address within 30s; stderr:\n%s", cfgPath, c.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return c
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// kill SIGKILLs the child and reaps it: from then on it owns nothing.
func (c *child) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
	c.exited.Store(true)
}

// owner reports whether the child may be acting as owner now. A child
// that does not answer /status while its process is alive (stalled,
// overloaded) keeps the role it last reported: silence is not proof that
// it stopped owning. Only a reaped process owns nothing.
func (c *child) owner() bool {
	if c.exited.Load() {
		return false
	}
	if r := c.role(); r != "" {
		return strings.HasPrefix(r, "owner")
	}
	last, _ := c.lastRole.Load().(string)
	return strings.HasPrefix(last, "owner")
}

// role is the child's session role and level from /status, "" when it
// does not answer.
func (c *child) role() string {
	cl := http.Client{Timeout: time.Second}
	resp, err := cl.Get("http://" + c.addr + "/status")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var st runtime.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || len(st.Sessions) == 0 {
		return ""
	}
	r := st.Sessions[0].Role + "/" + st.Sessions[0].ServiceLevel
	c.lastRole.Store(r)
	return r
}

// eventLog keeps every lease event of an in-process instance, so that a
// "never two owners" check reads the whole interval, not one instant.
type eventLog struct {
	mu     sync.Mutex
	events []lease.Event
}

func (l *eventLog) add(_ string, e lease.Event) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

// firstAcquired is when the first EventAcquired happened (zero if none).
func (l *eventLog) firstAcquired() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.events {
		if e.Kind == lease.EventAcquired {
			return e.Time
		}
	}
	return time.Time{}
}

// startClustered runs instance id in this process on cfg; events, if set,
// receives its lease events.
func startClustered(t *testing.T, cfg *config.Config, events *eventLog) *instance {
	t.Helper()
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("test_instance", cfg.Bridge.InstanceID)
	opts := runtime.Options{Logger: log, Registerer: reg}
	if events != nil {
		opts.OnLeaseEvent = events.add
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
		case <-in.done:
		case <-time.After(20 * time.Second):
			t.Error("bridge did not stop")
		}
	})
	return in
}

// testClusteredTakeover: in clustered mode on a shared lease store, the
// owner process is killed (SIGKILL: no release, no DISCONNECT); the
// standby in this process takes the lease over once it expires, resumes
// the broker session and delivers the QoS 1 messages that queued there;
// at no time do both instances serve as owner, and the store names the
// successor with a higher fencing version.
func testClusteredTakeover(t *testing.T, storeYAML string, store lease.Store) {
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = br.Close() }) // after the instances stop
	dir := t.TempDir()
	sk := newSink(t)
	pathA, _ := clusteredConfig(t, dir, "a", "127.0.0.1:0", storeYAML, br.URL, sk.srv.URL)
	a := startChild(t, pathA)
	testwait.Until(t, "a owns and serves", waitLimit, func() bool { return a.role() == "owner/full" })
	_, cfgB := clusteredConfig(t, dir, "b", "off", storeYAML, br.URL, sk.srv.URL)
	events := &eventLog{}
	bb := startClustered(t, cfgB, events)
	testwait.Until(t, "b standby", waitLimit, func() bool { return role(bb) == "standby/none" })

	// Watch for two owners at once until the end of the test. A child
	// that stops answering keeps its last role (see child.owner), so the
	// watcher can fire; the event stream check below covers what falls
	// between its samples.
	var both atomic.Int32
	watchCtx, stopWatch := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for watchCtx.Err() == nil {
			if strings.HasPrefix(role(bb), "owner") && a.owner() {
				both.Add(1)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	defer func() { stopWatch(); <-watched }()

	ctx := context.Background()
	before, err := store.Current(ctx, "t/plant")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(before.Owner, "a#") {
		t.Fatalf("store owner %q, want instance a", before.Owner)
	}
	p := publisher(t, br.URL)
	pub(t, p, 0, 50)
	testwait.Until(t, "first 50", waitLimit, func() bool { return sk.has(50) })

	killedAt := time.Now()
	a.kill(t)
	pub(t, p, 50, 100) // queued in the broker session until b resumes it
	if r := role(bb); r != "standby/none" {
		t.Fatalf("b is %s before the lease could expire: the messages did not queue", r)
	}
	testwait.Until(t, "b owns and serves", waitLimit, func() bool { return role(bb) == "owner/full" })
	testwait.Until(t, "all 100 delivered", waitLimit, func() bool { return sk.has(100) })

	after, err := store.Current(ctx, "t/plant")
	if err != nil {
		t.Fatal(err)
	}
	st := bb.b.Status().Sessions[0]
	if !strings.HasPrefix(after.Owner, "b#") || after.Owner != st.LeaseOwner || after.Version <= before.Version || st.LeaseVersion != after.Version {
		t.Fatalf("store %+v before, %+v after; b reports owner %q version %d", before, after, st.LeaseOwner, st.LeaseVersion)
	}
	if n := both.Load(); n != 0 {
		t.Fatalf("both instances reported owner in %d observations", n)
	}
	// Over the whole interval: b's lease events hold no acquisition before
	// a was killed (a owned from before b started until the kill).
	if at := events.firstAcquired(); at.IsZero() || at.Before(killedAt) {
		t.Fatalf("b acquired at %v, a was killed at %v", at, killedAt)
	}
}

func TestClusteredTakeoverPostgres(t *testing.T) {
	t.Parallel()
	pg := pgtest.New(t)
	dsn := pg.DSN("")
	store, err := pgstore.OpenDSN(context.Background(), dsn, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	testClusteredTakeover(t, fmt.Sprintf("{type: postgres, dsn: %q}", dsn), store)
}

func TestClusteredTakeoverEtcd(t *testing.T) {
	t.Parallel()
	endpoint := startEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	store := etcdstore.Open(cli, etcdstore.Options{Prefix: "/bridge-test/"})
	defer store.Close()
	testClusteredTakeover(t, fmt.Sprintf("{type: etcd, endpoints: [%q], prefix: /bridge-test/}", endpoint), store)
}

// startEtcd runs an embedded single-member etcd until the end of the test
// and returns its client URL.
func startEtcd(t *testing.T) string {
	t.Helper()
	return etcdtest.Start(t).Endpoint
}

// The two-owner watcher can fire: a child that owned and then stops
// answering (stalled, not dead) still counts as owner; only a reaped one
// does not.
func TestSilentChildStillCountsAsOwner(t *testing.T) {
	c := &child{addr: testnet.DeadAddr(t)} // nobody answers there
	c.lastRole.Store("owner/full")
	if !c.owner() {
		t.Fatal("a silent live child that last reported owner reads as not owner")
	}
	c.exited.Store(true)
	if c.owner() {
		t.Fatal("a reaped child reads as owner")
	}
}
