package journey_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/fence"
	fleetconfig "github.com/myriarch/myriarch/internal/fleet/config"
)

// The processes, the load balancer, the sink and the API client of the
// journey test. Nothing here is exported to other packages: the journey
// drives the programs as an operator would (their binaries, their
// environment, their HTTP API).

// buildBinaries starts building myriarchd and myriarch-bridge into a
// directory of the test; the returned func waits for the build and
// returns their paths. After `go vet ./...` (which `make test` runs
// first) every package is compiled in the build cache and this only links;
// without symbol tables (-s -w), which links faster.
func buildBinaries(t *testing.T) func() (myriarchd, bridge string) {
	t.Helper()
	dir := t.TempDir()
	start := time.Now()
	cmd := exec.Command("go", "build", "-ldflags=-s -w", "-o", dir+string(filepath.Separator),
		"github.com/myriarch/myriarch/cmd/myriarchd", "github.com/myriarch/myriarch/cmd/myriarch-bridge")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("go build: %v", err)
	}
	waited := false
	t.Cleanup(func() {
		if !waited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return func() (string, string) {
		t.Helper()
		waited = true
		if err := cmd.Wait(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out.String())
		}
		t.Logf("built myriarchd and myriarch-bridge in %v", time.Since(start).Round(time.Millisecond))
		return filepath.Join(dir, "myriarchd"), filepath.Join(dir, "myriarch-bridge")
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// proc is a child process whose output is kept for the failure log.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  syncBuf
	done chan struct{}
}

func startProc(t *testing.T, name string, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		if !p.exited() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-p.done
			}
		}
		if t.Failed() {
			log := p.out.String()
			if len(log) > 8000 {
				log = "…" + log[len(log)-8000:]
			}
			t.Logf("log of %s:\n%s", name, log)
		}
	})
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends sig and waits for the exit; it returns the exit status.
func (p *proc) stop(t *testing.T, sig syscall.Signal) *os.ProcessState {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signalling %s: %v", p.name, err)
	}
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Fatalf("%s did not exit within a minute of %v", p.name, sig)
	}
	return p.cmd.ProcessState
}

// replica is a myriarchd replica process.
type replica struct {
	*proc
	id, http, opamp string
}

// startReplica runs `myriarchd serve` with settings as MYRIARCH_*
// variables on loopback ports it binds itself, and waits until /readyz
// answers.
func startReplica(t *testing.T, bin, id string, settings map[string]string) *replica {
	t.Helper()
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MYRIARCH_") {
			env = append(env, kv)
		}
	}
	all := map[string]string{"ha.replicaId": id, "server.httpListen": "127.0.0.1:0", "server.opampListen": "127.0.0.1:0",
		"log.level": "info", "log.format": "text"}
	for k, v := range settings {
		all[k] = v
	}
	for k, v := range all {
		env = append(env, fleetconfig.EnvName(k)+"="+v)
	}
	cmd := exec.Command(bin, "serve")
	cmd.Env = env
	r := &replica{proc: startProc(t, id, cmd), id: id}
	until(t, id+" ready", time.Minute, func() bool {
		if r.exited() {
			t.Fatalf("%s exited at start:\n%s", id, r.out.String())
		}
		if r.http == "" {
			r.http, r.opamp = startedAddrs(r.out.String())
			if r.http == "" || r.opamp == "" {
				r.http = ""
				return false
			}
		}
		resp, err := http.Get("http://" + r.http + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return r
}

// startedAddrs reads the listeners from the log line "myriarchd replica
// started" (opamp=host:port/path http=host:port).
func startedAddrs(log string) (httpAddr, opampAddr string) {
	for line := range strings.Lines(log) {
		if !strings.Contains(line, "myriarchd replica started") || !strings.HasSuffix(line, "\n") {
			continue
		}
		for f := range strings.FieldsSeq(line) {
			if a, ok := strings.CutPrefix(f, "http="); ok {
				httpAddr = a
			}
			if a, ok := strings.CutPrefix(f, "opamp="); ok {
				opampAddr, _, _ = strings.Cut(a, "/")
			}
		}
		return httpAddr, opampAddr
	}
	return "", ""
}

// metric returns the value of an unlabelled metric on the replica's
// /metrics, or -1 when it cannot be read.
func (r *replica) metric(name string) float64 {
	resp, err := http.Get("http://" + r.http + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// balancer is a TCP load balancer in front of the replicas' OpAMP
// listeners, as a deployment has one: each connection goes to the first
// replica that accepts it, so the agents reconnect to a survivor when
// their replica dies.
type balancer struct {
	ln       net.Listener
	backends []string
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	wg       sync.WaitGroup
}

func startBalancer(t *testing.T, backends ...string) *balancer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &balancer{ln: ln, backends: backends, conns: map[net.Conn]struct{}{}}
	b.wg.Go(b.serve)
	t.Cleanup(b.close)
	return b
}

func (b *balancer) addr() string { return b.ln.Addr().String() }

func (b *balancer) track(c net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conns == nil {
		return false
	}
	b.conns[c] = struct{}{}
	return true
}

func (b *balancer) serve() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		if !b.track(c) {
			c.Close()
			return
		}
		b.wg.Go(func() { b.forward(c) })
	}
}

func (b *balancer) forward(c net.Conn) {
	defer c.Close()
	var up net.Conn
	for _, addr := range b.backends {
		var err error
		if up, err = net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
			break
		}
	}
	if up == nil || !b.track(up) {
		if up != nil {
			up.Close()
		}
		return
	}
	defer up.Close()
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(up, c); up.Close() })
	_, _ = io.Copy(c, up)
	c.Close()
	wg.Wait()
}

func (b *balancer) close() {
	b.ln.Close()
	b.mu.Lock()
	for c := range b.conns {
		c.Close()
	}
	b.conns = nil
	b.mu.Unlock()
	b.wg.Wait()
}

// delivery is one message as the HTTP sink received it.
type delivery struct {
	seq     int
	version uint64 // fencing stamp: lease version (0: none)
	session string // fencing stamp: session id
	stale   bool   // its version was below the highest seen before it
}

// sink is an HTTP destination that records every delivery in arrival
// order with its fencing stamp, and applies the consumer recipe of
// package fence (a delivery below the highest version seen is stale).
type sink struct {
	mu      sync.Mutex
	got     []delivery
	highest map[string]uint64
	srv     *httptest.Server
}

func newSink(t *testing.T) *sink {
	s := &sink{highest: map[string]uint64{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		n, err := strconv.Atoi(string(body))
		if err != nil {
			http.Error(w, "not a sequence number", http.StatusBadRequest)
			return
		}
		d := delivery{seq: n, session: r.Header.Get(fence.HeaderSessionID)}
		d.version, _ = strconv.ParseUint(r.Header.Get(fence.HeaderLeaseVersion), 10, 64)
		s.mu.Lock()
		if d.version < s.highest[d.session] {
			d.stale = true
		} else {
			s.highest[d.session] = d.version
		}
		s.got = append(s.got, d)
		s.mu.Unlock()
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *sink) deliveries() []delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]delivery(nil), s.got...)
}

// missing lists the numbers in [from, to) that no fresh (non-stale)
// delivery carried: what a consumer that fences would have lost.
func (s *sink) missing(from, to int) []int {
	fresh := map[int]bool{}
	for _, d := range s.deliveries() {
		if !d.stale {
			fresh[d.seq] = true
		}
	}
	var out []int
	for i := from; i < to; i++ {
		if !fresh[i] {
			out = append(out, i)
		}
	}
	return out
}

// versionsAfter returns the lease versions stamped on deliveries of
// numbers ≥ from, and the session ids seen.
func (s *sink) versionsAfter(from int) (versions map[uint64]int, sessions map[string]int) {
	versions, sessions = map[uint64]int{}, map[string]int{}
	for _, d := range s.deliveries() {
		if d.seq >= from {
			versions[d.version]++
			sessions[d.session]++
		}
	}
	return versions, sessions
}

// client is the operator's API client (an admin token).
type client struct {
	t     *testing.T
	base  string
	token string
}

// do sends a request; out receives the JSON answer of a 2xx.
func (c client) do(method, path string, body any, out any) (int, string) {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			c.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(b, out); err != nil {
			c.t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	return resp.StatusCode, string(b)
}

// must is do that fails the test on any other status than want.
func (c client) must(want int, method, path string, body any, out any) {
	c.t.Helper()
	if code, b := c.do(method, path, body, out); code != want {
		c.t.Fatalf("%s %s: %d %s; want %d", method, path, code, b, want)
	}
}

// get is do for polling: false unless 200.
func (c client) get(path string, out any) bool {
	c.t.Helper()
	code, _ := c.do("GET", path, nil, out)
	return code == http.StatusOK
}

// until polls cond every 50 ms until it holds, and fails the test after
// limit (generous: the machine running the suite may be loaded).
func until(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runQuiet runs a command and returns its stdout, failing the test with
// its stderr.
func runQuiet(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%v: %s", err, stderr.String())
		}
		t.Fatalf("%s: %v", strings.Join(cmd.Args, " "), err)
	}
	return string(out)
}
