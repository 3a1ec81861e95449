package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/fleet/api/openapitest"
	"github.com/myriarch/myriarch/internal/fleet/config"
	"github.com/myriarch/myriarch/internal/fleet/daemon"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/pgleader"
)

// reexecEnv makes the test binary run `myriarchd` with its arguments
// instead of the tests, so that a test can run a real replica process and
// signal it.
const reexecEnv = "MYRIARCHD_TEST_REEXEC"

func TestMain(m *testing.M) {
	if os.Getenv(reexecEnv) == "1" {
		os.Exit(commands.Dispatch(os.Args[1:], os.Stdout, os.Stderr))
	}
	// Every answer the commands receive is checked against the API's
	// OpenAPI document; no command may find a contexts file of the
	// machine's user.
	apiTransport = openapitest.Transport(nil)
	os.Setenv("MYRIARCH_CONTEXTS", filepath.Join(os.TempDir(), fmt.Sprintf("myriarchd-test-no-contexts-%d.yaml", os.Getpid())))
	goleak.VerifyTestMain(m)
}

const testSecret = "0123456789abcdef-secret"

// replicaProc is a myriarchd replica running as a child process.
type replicaProc struct {
	t       *testing.T
	cmd     *exec.Cmd
	stderr  syncBuf
	http    string // host:port
	opamp   string
	done    chan struct{}
	waitErr error
}

// startedAddrs reads the listeners' addresses from the replica's log line
// "myriarchd replica started" (text format: opamp=host:port/path
// http=host:port); "" while it has not been written whole.
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

// startReplica runs `myriarchd serve` with settings as MYRIARCH_* variables
// and waits until it is ready. It listens on loopback ports that it binds
// itself (port 0) and logs: a port found free here and bound by the child
// after its start-up could be taken by another process in between.
func startReplica(t *testing.T, settings map[string]string) *replicaProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	r := &replicaProc{t: t, done: make(chan struct{})}
	env := []string{reexecEnv + "=1"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MYRIARCH_") {
			env = append(env, kv)
		}
	}
	settings["server.httpListen"] = "127.0.0.1:0"
	settings["server.opampListen"] = "127.0.0.1:0"
	settings["log.level"] = "info"
	settings["log.format"] = "text"
	for k, v := range settings {
		env = append(env, config.EnvName(k)+"="+v)
	}
	r.cmd = exec.Command(exe, "serve")
	r.cmd.Env = env
	r.cmd.Stdout = io.Discard
	r.cmd.Stderr = &r.stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		r.waitErr = r.cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		<-r.done
		if t.Failed() {
			t.Logf("log of %s:\n%s", settings["ha.replicaId"], r.stderr.String())
		}
	})
	if !fleettest.Eventually(time.Minute, func() bool {
		select {
		case <-r.done:
			return true
		default:
		}
		if r.http == "" {
			if r.http, r.opamp = startedAddrs(r.stderr.String()); r.http == "" || r.opamp == "" {
				r.http = ""
				return false
			}
		}
		resp, err := http.Get("http://" + r.http + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}) || r.exited() {
		t.Fatalf("replica did not become ready (exited: %v): %s", r.exited(), r.stderr.String())
	}
	return r
}

func (r *replicaProc) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// leads reports whether the replica's /metrics says myriarch_leader 1.
func (r *replicaProc) leads() bool {
	resp, err := http.Get("http://" + r.http + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.Contains(string(b), "\nmyriarch_leader 1\n")
}

// waitPhase waits until the replica logged the start of a stop phase.
func (r *replicaProc) waitPhase(phase string) {
	r.t.Helper()
	if !fleettest.Eventually(time.Minute, func() bool {
		return strings.Contains(r.stderr.String(), `msg="planned stop" phase=`+phase+"\n")
	}) {
		r.t.Fatalf("phase %s not reached: %s", phase, r.stderr.String())
	}
}

func (r *replicaProc) signal(sig syscall.Signal) {
	r.t.Helper()
	if err := r.cmd.Process.Signal(sig); err != nil {
		r.t.Fatal(err)
	}
}

// waitExit waits for the process and returns how it ended.
func (r *replicaProc) waitExit() *os.ProcessState {
	r.t.Helper()
	select {
	case <-r.done:
	case <-time.After(time.Minute):
		r.t.Fatal("replica did not exit")
	}
	return r.cmd.ProcessState
}

// holdRequest sends the headers of a request whose 1000-byte body never
// finishes arriving, and returns once the handler reads the body (the
// server answered "100 Continue"): the request is in flight.
func holdRequest(t *testing.T, addr, method, path string, headers ...string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	req := method + " " + path + " HTTP/1.1\r\nHost: test\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n"
	for _, h := range headers {
		req += h + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	for _, want := range []string{" 100 ", "\r\n"} {
		line, err := br.ReadString('\n')
		if err != nil || !strings.Contains(line, want) {
			t.Fatalf("%s %s: expected 100 Continue, got %q %v", method, path, line, err)
		}
	}
	if _, err := io.WriteString(c, "0123456789"); err != nil {
		t.Fatal(err)
	}
	return c
}

// cutWithoutAnswer checks that a held request ends without a response.
func cutWithoutAnswer(t *testing.T, name string, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := c.Read(make([]byte, 512))
	var ne net.Error
	if n > 0 || err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Errorf("%s request: read %d bytes, %v; want the connection cut without an answer", name, n, err)
	}
}

func inProcessReplica(t *testing.T, dsn, id string, settings map[string]string) *daemon.Daemon {
	t.Helper()
	ov := map[string]string{"database.url": dsn, "server.enrollmentSecret": testSecret, "ha.replicaId": id,
		"server.opampListen": "127.0.0.1:0", "server.httpListen": "127.0.0.1:0", "database.maxConns": "6"}
	for k, v := range settings {
		ov[k] = v
	}
	c, err := config.Load(config.Source{Environ: []string{}, Overrides: ov})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := daemon.Start(ctx, daemon.Options{Config: c, Log: slog.New(slog.DiscardHandler), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Shutdown() })
	return d
}

// A replica killed (SIGKILL) while it drains on SIGTERM loses what the
// high-availability guide says and nothing else. Killed in the OpAMP phase
// (before its final flush), the leader
//   - releases the lock at once: PostgreSQL ends its session when the
//     operating system closes the connection, and the other replica leads
//     after one follower retry, long before ha.leaderSessionTimeout;
//   - loses its final flush: no "disconnected"/"replica stopped" events, no
//     offline marking, and the batched events it had not written yet;
//   - and its agents are marked offline later by the new leader's offline
//     sweeper (agents.offlineAfter).
//
// A second replica killed in the HTTP drain, after its final flush, loses
// only its open requests.
func TestReplicaKilledWhileDraining(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	dsn := pg.DSN("")
	// T = 60s: the follower retries every 5s (at most 6s with jitter), the
	// server would drop a silent session only after about 50s, and a
	// follower ends a stale leader's session only after T. A takeover well
	// within T is the operating system's close of the killed connection.
	const leaderSessionTimeout = 60 * time.Second
	common := map[string]string{
		"database.url": dsn, "server.enrollmentSecret": testSecret,
		"ha.leaderSessionTimeout": leaderSessionTimeout.String(), "ha.heartbeatInterval": "1s",
		"server.shutdownTimeout": "30s", "agents.offlineAfter": "10s", "jobs.offlineSweepInterval": "1s",
		"database.maxConns": "6",
	}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range common {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	// K flushes rarely: the events of its agents are still in its memory
	// when it is killed.
	// Its own sweeper must not mark them while it leads: the 10s of
	// agents.offlineAfter are F's, which leads after the kill.
	k := startReplica(t, with(map[string]string{"ha.replicaId": "replica-k", "server.lastSeenFlushInterval": "1m", "agents.offlineAfter": "5m"}))
	if !fleettest.Eventually(time.Minute, k.leads) {
		t.Fatal("K does not lead")
	}
	f := inProcessReplica(t, dsn, "replica-f", with(map[string]string{"server.lastSeenFlushInterval": "200ms"}))
	agentOnline := func(ag *fleettest.Agent) {
		t.Helper()
		if !fleettest.Eventually(time.Minute, func() bool {
			x, err := f.Store.GetAgent(ctx, ag.UIDString())
			return err == nil && x.Status == "online" && x.Identifying["service.name"] != ""
		}) {
			t.Fatalf("agent %s not online", ag.UIDString())
		}
	}
	var onK []*fleettest.Agent
	for range 3 {
		ag, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + k.opamp + "/v1/opamp", Secret: testSecret})
		if err != nil {
			t.Fatal(err)
		}
		defer ag.Stop(ctx)
		onK = append(onK, ag)
	}
	for _, ag := range onK {
		agentOnline(ag)
	}
	cur, ok, err := pgleader.CurrentTerm(ctx, f.Store.Pool, pgleader.DefaultLockKey)
	if err != nil || !ok {
		t.Fatalf("current term: %+v, %v, %v", cur, ok, err)
	}
	lockPID := cur.LockPID

	// SIGTERM to K, with a plain-HTTP agent poll that holds its OpAMP drain
	// open; SIGKILL as soon as the drain runs.
	held := holdRequest(t, k.opamp, "POST", "/v1/opamp", "Authorization: Bearer "+testSecret, "Content-Type: application/x-protobuf")
	k.signal(syscall.SIGTERM)
	k.waitPhase(daemon.PhaseOpAMPClose)
	k.signal(syscall.SIGKILL)
	killedAt := time.Now()
	if st := k.waitExit(); st.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("K ended with %v, want SIGKILL", st)
	}
	if strings.Contains(k.stderr.String(), "phase="+daemon.PhaseFinalFlush) {
		t.Fatal("K reached its final flush before the kill; the test must kill it earlier")
	}
	cutWithoutAnswer(t, "held OpAMP", held)

	// The lock: K's lock session is gone and F leads, well within T.
	if !fleettest.Eventually(30*time.Second, func() bool {
		var n int
		_ = f.Store.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", lockPID).Scan(&n)
		return n == 0
	}) {
		t.Fatalf("PostgreSQL kept the lock session %d of the killed leader", lockPID)
	}
	if !fleettest.Eventually(leaderSessionTimeout/2, f.Elector.IsLeader) {
		t.Fatalf("F does not lead %v after the leader was killed (T = %v)", time.Since(killedAt), leaderSessionTimeout)
	}
	t.Logf("F leads %v after the kill", time.Since(killedAt).Round(time.Millisecond))

	// The final flush is missing and the sweeper catches up: each agent of
	// K is marked offline by the leader's sweeper, and its event log holds
	// only that (the batched "connected" events died with K, the final
	// flush's "disconnected ... replica stopped" never happened).
	for _, ag := range onK {
		var x store.Agent
		if !fleettest.Eventually(time.Minute, func() bool {
			x, _ = f.Store.GetAgent(ctx, ag.UIDString())
			return x.Status == "offline"
		}) {
			t.Fatalf("agent of the killed replica never marked offline: %+v", x)
		}
		evs, err := f.Store.Events(ctx, ag.UIDString(), 10)
		if err != nil {
			t.Fatal(err)
		}
		var kinds []string
		for _, e := range evs {
			kinds = append(kinds, e.Kind+"/"+e.ReplicaID+"/"+e.Detail)
		}
		if want := []string{store.EventMarkedOffline + "/replica-k/no heartbeat for 10s"}; !slices.Equal(kinds, want) {
			t.Fatalf("events of agent %s: %q, want %q", ag.UIDString(), kinds, want)
		}
		if x.ReplicaID != "replica-k" || x.Identifying["service.name"] != "test-agent" {
			t.Fatalf("what K wrote at once is gone: %+v", x)
		}
	}
	t.Logf("K's agents marked offline by the sweeper %v after the kill", time.Since(killedAt).Round(time.Millisecond))

	// D, a follower of F, killed in the HTTP drain, after its final flush:
	// its agent was marked offline by that flush; only the open API request
	// is lost.
	d := startReplica(t, with(map[string]string{"ha.replicaId": "replica-d", "server.lastSeenFlushInterval": "200ms"}))
	// The agent heartbeats every second, so that F's sweeper leaves it alone
	// while it is connected.
	agD, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + d.opamp + "/v1/opamp", Secret: testSecret, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer agD.Stop(ctx)
	agentOnline(agD)
	tok, err := f.Store.CreateToken(ctx, "test")
	if err != nil {
		t.Fatal(err)
	}
	apiHeld := holdRequest(t, d.http, "PUT", "/api/v1/agents/"+agD.UIDString()+"/config", "Authorization: Bearer "+tok)
	d.signal(syscall.SIGTERM)
	d.waitPhase(daemon.PhaseHTTPDrain)
	d.signal(syscall.SIGKILL)
	if st := d.waitExit(); st.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("D ended with %v, want SIGKILL", st)
	}
	cutWithoutAnswer(t, "held API", apiHeld)
	x, err := f.Store.GetAgent(ctx, agD.UIDString())
	if err != nil {
		t.Fatal(err)
	}
	evs, _ := f.Store.Events(ctx, agD.UIDString(), 10)
	if x.Status != "offline" || len(evs) == 0 || evs[0].Kind != store.EventDisconnected || evs[0].Detail != "replica stopped" {
		t.Fatalf("D's final flush before the kill is missing: %+v %+v", x, evs)
	}
	if !slices.ContainsFunc(evs, func(e store.Event) bool { return e.Kind == store.EventConnected }) {
		t.Fatalf("D's batched events were lost although it flushed: %+v", evs)
	}
	if x.DesiredConfigHash != "" {
		t.Fatalf("the cut request stored a config: %+v", x)
	}
	if !f.Elector.IsLeader() {
		t.Fatal("F lost leadership")
	}
}
