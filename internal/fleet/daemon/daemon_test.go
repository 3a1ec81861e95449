package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/fleet/api"
	"github.com/myriarch/myriarch/internal/fleet/api/openapitest"
	"github.com/myriarch/myriarch/internal/fleet/config"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
	"go.uber.org/goleak"
)

// Every answer of the API that the tests receive through the default
// client (http.Get, http.DefaultClient) is validated against its OpenAPI
// document. (Not http.DefaultTransport: the S3 store clones it.)
func TestMain(m *testing.M) {
	http.DefaultClient.Transport = openapitest.Transport(nil)
	goleak.VerifyTestMain(m)
}

const secret = "0123456789abcdef-secret"

func testConfig(t *testing.T, dsn, replica string, extra map[string]string) *config.Config {
	t.Helper()
	ov := map[string]string{
		"database.url": dsn, "server.enrollmentSecret": secret, "ha.replicaId": replica,
		"server.opampListen": "127.0.0.1:0", "server.httpListen": "127.0.0.1:0",
		"ha.leaderSessionTimeout": "10s", "ha.heartbeatInterval": "1s",
		"server.lastSeenFlushInterval": "200ms", "server.shutdownTimeout": "10s",
		"agents.reconcileInterval":  "10m", // the notification path must do the work
		"jobs.offlineSweepInterval": "1s", "database.maxConns": "8",
	}
	for k, v := range extra {
		ov[k] = v
	}
	c, err := config.Load(config.Source{Environ: []string{}, Overrides: ov})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func start(t *testing.T, c *config.Config, onPhase func(string)) *Daemon {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	d, err := Start(ctx, Options{Config: c, Log: log, Version: "test", OnPhase: onPhase})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

type client struct {
	base, token string
}

func (c client) do(t *testing.T, method, path, body string, out any) int {
	t.Helper()
	req, _ := http.NewRequest(method, c.base+path, strings.NewReader(body))
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	return resp.StatusCode
}

func TestTwoReplicas(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	var mu sync.Mutex
	var phases []string
	a := start(t, testConfig(t, pg.DSN(""), "replica-a", nil), nil)
	defer a.Shutdown()
	b := start(t, testConfig(t, pg.DSN(""), "replica-b", nil), func(p string) {
		mu.Lock()
		phases = append(phases, p)
		mu.Unlock()
	})
	defer b.Shutdown()

	tok, err := a.Store.CreateToken(ctx, "admin")
	if err != nil {
		t.Fatal(err)
	}
	anon := client{base: "http://" + a.HTTPAddr().String()}
	ca := client{base: anon.base, token: tok}

	// Probes and metrics need no token; the API does.
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		if code := anon.do(t, "GET", p, "", nil); code != 200 {
			t.Errorf("%s: %d", p, code)
		}
	}
	resp, err := http.Get(anon.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{"myriarch_leader ", "myriarch_opamp_connections ", "myriarch_lastseen_flushes_total ", "myriarch_eventbus_reconciles_total ", "go_goroutines "} {
		if !strings.Contains(string(metrics), "\n"+m) {
			t.Errorf("metric %s missing", m)
		}
	}
	for _, p := range []string{"/api/v1/agents", "/api/v1/cluster", "/api/v1/overview", "/api/v1/nothing"} {
		if code := anon.do(t, "GET", p, "", nil); code != 401 {
			t.Errorf("%s without token: %d", p, code)
		}
	}
	if code := anon.do(t, "PUT", "/api/v1/agents/x/config", `{"config":"x"}`, nil); code != 401 {
		t.Errorf("unauthenticated write: %d", code)
	}
	if code := (client{base: anon.base, token: "myr_wrong"}).do(t, "GET", "/api/v1/agents", "", nil); code != 401 {
		t.Errorf("wrong token: %d", code)
	}

	// One agent on each replica.
	onB, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + b.OpAMPAddr().String() + "/v1/opamp", Secret: secret,
		Attrs: map[string]string{"env": "prod"}})
	if err != nil {
		t.Fatal(err)
	}
	defer onB.Stop(ctx)
	onA, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + a.OpAMPAddr().String() + "/v1/opamp", Secret: secret,
		Attrs: map[string]string{"env": "dev"}})
	if err != nil {
		t.Fatal(err)
	}
	defer onA.Stop(ctx)

	var list api.AgentList
	if !fleettest.Eventually(30*time.Second, func() bool {
		list = api.AgentList{}
		ca.do(t, "GET", "/api/v1/agents?status=online&selector=env%3Dprod", "", &list)
		return len(list.Agents) == 1
	}) {
		t.Fatalf("agent list: %+v", list)
	}
	if list.Agents[0].InstanceUID != onB.UIDString() || list.Agents[0].ReplicaID != "replica-b" {
		t.Fatalf("agent: %+v", list.Agents[0])
	}
	// The agent on A may connect after the one on B (a loaded machine).
	if !fleettest.Eventually(30*time.Second, func() bool {
		list = api.AgentList{}
		ca.do(t, "GET", "/api/v1/agents?replica=replica-a", "", &list)
		return len(list.Agents) == 1
	}) || list.Agents[0].InstanceUID != onA.UIDString() {
		t.Fatalf("replica filter: %+v", list)
	}
	if code := ca.do(t, "GET", "/api/v1/agents?status=weird", "", nil); code != 400 {
		t.Fatalf("bad filter: %d", code)
	}

	// Remote config set on replica A reaches the agent connected to B
	// through NOTIFY (the reconcile interval is 10 minutes here).
	if code := ca.do(t, "PUT", "/api/v1/agents/"+onB.UIDString()+"/config", `{"config":"receivers: {otlp: {}}\n"}`, nil); code != 202 {
		t.Fatalf("set config: %d", code)
	}
	if !fleettest.Eventually(30*time.Second, func() bool { return slices.Contains(onB.Configs(), "receivers: {otlp: {}}\n") }) {
		t.Fatal("config did not reach the agent on the other replica")
	}
	var det api.AgentDetail
	if !fleettest.Eventually(30*time.Second, func() bool {
		ca.do(t, "GET", "/api/v1/agents/"+onB.UIDString(), "", &det)
		return det.Agent.RemoteConfigStatus == "applied" && len(det.Events) >= 3
	}) {
		t.Fatalf("status not tracked back: %+v", det.Agent)
	}
	if det.Agent.RemoteConfigHash != store.ConfigHash("receivers: {otlp: {}}\n") || det.Events[0].Kind != store.EventConfigApplied {
		t.Fatalf("detail: %+v", det)
	}
	if code := ca.do(t, "PUT", "/api/v1/agents/nope/config", `{"config":"x"}`, nil); code != 404 {
		t.Fatalf("unknown agent: %d", code)
	}

	// Cluster: two replicas, one leader with a term, the jobs ran.
	var cl api.ClusterInfo
	if !fleettest.Eventually(30*time.Second, func() bool {
		cl = api.ClusterInfo{}
		ca.do(t, "GET", "/api/v1/cluster", "", &cl)
		return len(cl.Replicas) == 2 && cl.Leader != nil && cl.Leader.Active && len(cl.JobRuns) == 7 // offline_sweeper, housekeeping, rollout_engine, release_tracker, artifact_prefetch, package_rollouts, telemetry
	}) {
		t.Fatalf("cluster: %+v", cl)
	}
	if cl.Leader.Term < 1 || (cl.Leader.ID != "replica-a" && cl.Leader.ID != "replica-b") {
		t.Fatalf("leader %+v", cl.Leader)
	}
	// The jobs ran on the leader only, in its term.
	for _, r := range cl.JobRuns {
		if r.ReplicaID != cl.Leader.ID || r.Term != cl.Leader.Term {
			t.Fatalf("job %s ran on %s in term %d; leader %+v", r.Name, r.ReplicaID, r.Term, cl.Leader)
		}
	}

	// Planned stop of B: exactly the spec's order; its agent is marked
	// offline by the final flush.
	if err := b.Shutdown(); err != nil {
		t.Fatal(err)
	}
	want := []string{PhaseOpAMPClose, PhaseFinalFlush, PhaseHTTPDrain, PhaseLeaderRelease, PhaseClose}
	if !slices.Equal(phases, want) {
		t.Fatalf("stop phases %v, want %v", phases, want)
	}
	ca.do(t, "GET", "/api/v1/agents/"+onB.UIDString(), "", &det)
	if det.Agent.Status != "offline" || det.Events[0].Detail != "replica stopped" {
		t.Fatalf("after planned stop: %+v %+v", det.Agent, det.Events[0])
	}
	// A leads now (B released the lock on its way out).
	if !fleettest.Eventually(30*time.Second, a.Elector.IsLeader) {
		t.Fatal("A does not lead after B stopped")
	}
}

func TestKilledReplicaLosesOnlyItsFlushAndTheSweeperCatchesUp(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	a := start(t, testConfig(t, pg.DSN(""), "replica-a", map[string]string{"agents.offlineAfter": "10s"}), nil)
	defer a.Shutdown()
	if !fleettest.Eventually(30*time.Second, a.Elector.IsLeader) {
		t.Fatal("A does not lead")
	}
	// K flushes rarely, so the agent's events are still in its memory when
	// it is killed: they are what a kill loses, with the offline marking.
	k := start(t, testConfig(t, pg.DSN(""), "replica-k", map[string]string{"server.lastSeenFlushInterval": "1m", "agents.offlineAfter": "5m"}), nil)
	ag, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + k.OpAMPAddr().String() + "/v1/opamp", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Stop(ctx)
	if !fleettest.Eventually(30*time.Second, func() bool {
		x, err := a.Store.GetAgent(ctx, ag.UIDString())
		return err == nil && x.Status == "online" && x.Identifying["service.name"] != ""
	}) {
		t.Fatal("agent not online")
	}
	k.Kill()
	// The kill skipped the final flush: the row still says online and the
	// batched "connected" event is gone ...
	x, _ := a.Store.GetAgent(ctx, ag.UIDString())
	if x.Status != "online" {
		t.Fatalf("killed replica marked its agent: %+v", x)
	}
	if evs, _ := a.Store.Events(ctx, ag.UIDString(), 5); len(evs) != 0 {
		t.Fatalf("events of a killed replica were written: %+v", evs)
	}
	// ... but the state it wrote at once (description, health) is there.
	if x.Identifying["service.name"] != "test-agent" || x.ReplicaID != "replica-k" {
		t.Fatalf("agent row: %+v", x)
	}
	// ... until the leader's offline sweeper marks it (agents.offlineAfter).
	if !fleettest.Eventually(60*time.Second, func() bool {
		x, _ = a.Store.GetAgent(ctx, ag.UIDString())
		return x.Status == "offline"
	}) {
		t.Fatalf("sweeper did not mark the agent of the killed replica: %+v", x)
	}
	evs, _ := a.Store.Events(ctx, ag.UIDString(), 5)
	if len(evs) == 0 || evs[0].Kind != store.EventMarkedOffline {
		t.Fatalf("events %+v", evs)
	}
}

// holdRequest sends the headers of a request whose body of 1000 bytes
// never finishes arriving. It returns once the handler reads the body (the
// server answered "100 Continue"), so the request is in flight.
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
	line, err := br.ReadString('\n')
	if err != nil || !strings.Contains(line, " 100 ") {
		t.Fatalf("%s %s: no 100 Continue: %q %v", method, path, line, err)
	}
	if _, err := br.ReadString('\n'); err != nil { // the empty line after it
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "0123456789"); err != nil {
		t.Fatal(err)
	}
	return c
}

// A drain that runs into server.shutdownTimeout does not hold up the rest
// of the planned stop: each later phase still runs, in order, within its
// own bound, and the whole stop fits the grace-period formula.
func TestDrainTimeoutsDoNotStopTheLaterPhases(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	type stamp struct {
		phase string
		at    time.Time
	}
	var mu sync.Mutex
	var stamps []stamp
	const shutdownTimeout = time.Second
	a := start(t, testConfig(t, pg.DSN(""), "replica-a", map[string]string{"server.shutdownTimeout": shutdownTimeout.String()}), func(p string) {
		mu.Lock()
		stamps = append(stamps, stamp{p, time.Now()})
		mu.Unlock()
	})
	defer a.Shutdown()
	if !fleettest.Eventually(30*time.Second, a.Elector.IsLeader) {
		t.Fatal("A does not lead")
	}
	b := start(t, testConfig(t, pg.DSN(""), "replica-b", nil), nil)
	defer b.Shutdown()
	tok, err := a.Store.CreateToken(ctx, "admin")
	if err != nil {
		t.Fatal(err)
	}
	ag, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + a.OpAMPAddr().String() + "/v1/opamp", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Stop(ctx)
	if !fleettest.Eventually(30*time.Second, func() bool {
		x, err := a.Store.GetAgent(ctx, ag.UIDString())
		return err == nil && x.Status == "online" && x.Identifying["service.name"] != ""
	}) {
		t.Fatal("agent not online")
	}
	// A plain-HTTP agent poll holds the OpAMP drain, an API upload the HTTP
	// drain; neither finishes.
	opampHeld := holdRequest(t, a.OpAMPAddr().String(), "POST", "/v1/opamp", "Authorization: Bearer "+secret, "Content-Type: application/x-protobuf")
	apiHeld := holdRequest(t, a.HTTPAddr().String(), "PUT", "/api/v1/agents/"+ag.UIDString()+"/config", "Authorization: Bearer "+tok)

	began := time.Now()
	err = a.Shutdown()
	ended := time.Now()
	if err == nil || !strings.Contains(err.Error(), "OpAMP close") || !strings.Contains(err.Error(), "HTTP drain") {
		t.Fatalf("Shutdown should report both drain timeouts: %v", err)
	}
	mu.Lock()
	got := slices.Clone(stamps)
	mu.Unlock()
	var phases []string
	took := map[string]time.Duration{}
	for i, s := range got {
		phases = append(phases, s.phase)
		end := ended
		if i+1 < len(got) {
			end = got[i+1].at
		}
		took[s.phase] = end.Sub(s.at)
	}
	want := []string{PhaseOpAMPClose, PhaseFinalFlush, PhaseHTTPDrain, PhaseLeaderRelease, PhaseClose}
	if !slices.Equal(phases, want) {
		t.Fatalf("stop phases %v, want %v", phases, want)
	}
	t.Logf("phases: %v; total %v", took, ended.Sub(began))
	// Both drains waited for their full timeout (a lower bound the code
	// guarantees) ...
	if took[PhaseOpAMPClose] < shutdownTimeout || took[PhaseHTTPDrain] < shutdownTimeout {
		t.Errorf("a drain ended before its timeout: %v", took)
	}
	// ... and the later phases kept their own bounds, so the whole stop fits
	// terminationGracePeriodSeconds without the preStop sleep.
	if took[PhaseFinalFlush] > config.FinalFlushDeadline || took[PhaseLeaderRelease]+took[PhaseClose] > failover.LeaderReleaseBound {
		t.Errorf("a phase exceeded its bound: %v", took)
	}
	grace, err := config.TerminationGracePeriod(0, shutdownTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if total := ended.Sub(began); total > grace {
		t.Errorf("stop took %v, more than the formula's %v", total, grace)
	}
	// The final flush ran after the OpAMP drain timed out.
	var det api.AgentDetail
	x, _ := b.Store.GetAgent(ctx, ag.UIDString())
	evs, _ := b.Store.Events(ctx, ag.UIDString(), 5)
	det = api.AgentDetail{Agent: x, Events: evs}
	if x.Status != "offline" || len(evs) == 0 || evs[0].Detail != "replica stopped" {
		t.Fatalf("final flush did not run after the OpAMP drain timeout: %+v", det)
	}
	// The held requests were cut without an answer when their phase ended.
	for name, c := range map[string]net.Conn{"OpAMP": opampHeld, "API": apiHeld} {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := c.Read(make([]byte, 512))
		var ne net.Error
		if n > 0 || err == nil || (errors.As(err, &ne) && ne.Timeout()) {
			t.Errorf("%s request held past the stop: read %d bytes, %v", name, n, err)
		}
	}
	// And the leader released its lock: B leads.
	if !fleettest.Eventually(30*time.Second, b.Elector.IsLeader) {
		t.Fatal("B does not lead after A stopped")
	}
}

// Tokens are listed and revoked through the API; a revoked token is refused
// by the very next request on every replica (they do not cache tokens).
func TestTokensRevokedAtOnceOnEveryReplica(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	a := start(t, testConfig(t, pg.DSN(""), "replica-a", nil), nil)
	defer a.Shutdown()
	b := start(t, testConfig(t, pg.DSN(""), "replica-b", nil), nil)
	defer b.Shutdown()
	admin, adminTok, err := a.Store.IssueToken(ctx, "admin")
	if err != nil {
		t.Fatal(err)
	}
	ci, ciTok, err := a.Store.IssueToken(ctx, "ci")
	if err != nil {
		t.Fatal(err)
	}
	baseA, baseB := "http://"+a.HTTPAddr().String(), "http://"+b.HTTPAddr().String()
	onA, onB := client{baseA, adminTok}, client{baseB, adminTok}
	ciOnB := client{baseB, ciTok}

	for _, path := range []string{"/api/v1/tokens", "/api/v1/tokens/1"} {
		method := "GET"
		if strings.HasSuffix(path, "1") {
			method = "DELETE"
		}
		if code := (client{base: baseA}).do(t, method, path, "", nil); code != 401 {
			t.Fatalf("%s %s without token: %d", method, path, code)
		}
	}
	if code := ciOnB.do(t, "GET", "/api/v1/agents", "", nil); code != 200 {
		t.Fatalf("ci token before the revocation: %d", code)
	}
	var list api.TokenList
	if code := onB.do(t, "GET", "/api/v1/tokens", "", &list); code != 200 || len(list.Tokens) != 2 ||
		list.Tokens[0].ID != ci.ID || list.Tokens[1].ID != admin.ID || list.Tokens[0].LastUsedAt == nil {
		t.Fatalf("list: %d %+v", code, list)
	}

	var rev api.Revocation
	if code := onA.do(t, "DELETE", fmt.Sprintf("/api/v1/tokens/%d", ci.ID), "", &rev); code != 200 || !rev.Revoked ||
		rev.Token.RevokedAt == nil || rev.Token.RevokedBy != fmt.Sprintf("token admin (id %d)", admin.ID) {
		t.Fatalf("revoke: %d %+v", code, rev)
	}
	// The next request on the other replica is refused, the API's and the
	// UI's check alike.
	if code := ciOnB.do(t, "GET", "/api/v1/agents", "", nil); code != 401 {
		t.Fatalf("revoked token on the other replica: %d", code)
	}
	if name, err := b.API.Authenticate(ctx, ciTok); name != "" || err != nil {
		t.Fatalf("UI check accepts the revoked token: %q %v", name, err)
	}
	if code := onB.do(t, "GET", "/api/v1/agents", "", nil); code != 200 {
		t.Fatalf("other token after the revocation: %d", code)
	}
	if code := onB.do(t, "DELETE", fmt.Sprintf("/api/v1/tokens/%d", ci.ID), "", &rev); code != 200 || rev.Revoked {
		t.Fatalf("second revoke: %d %+v", code, rev)
	}
	for path, want := range map[string]int{"/api/v1/tokens/x": 400, "/api/v1/tokens/0": 400, fmt.Sprintf("/api/v1/tokens/%d", ci.ID+100): 404} {
		if code := onA.do(t, "DELETE", path, "", nil); code != want {
			t.Errorf("DELETE %s: %d, want %d", path, code, want)
		}
	}
	list = api.TokenList{}
	if code := onA.do(t, "GET", "/api/v1/tokens?status=revoked", "", &list); code != 200 || len(list.Tokens) != 1 || list.Tokens[0].ID != ci.ID {
		t.Fatalf("revoked list: %d %+v", code, list)
	}
	if code := onA.do(t, "GET", "/api/v1/tokens?status=old", "", nil); code != 400 {
		t.Fatalf("bad status: %d", code)
	}
}
