package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
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

	"github.com/eclipse/paho.golang/paho"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	bridgeopamp "github.com/myriarch/myriarch/internal/bridge/opamp"
	fleetconfig "github.com/myriarch/myriarch/internal/fleet/config"
	"github.com/myriarch/myriarch/internal/fleet/daemon"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
)

const e2eSecret = "0123456789abcdef-e2e-secret"

// e2eConfig is the configuration myriarchd pushes: the same text for both
// bridges (instance ids are derived, paths are relative to each bridge's
// directory, except the shared lease store).
const e2eConfig = `bridge:
  id: plant
  shutdown_timeout: 5s
  http: {listen: "off"}
stores:
  lease: {type: sqlite, path: LEASEDB}
sessions:
  - id: plant
    session_mode: exclusive
    brokers: ["BROKER"]
    client_id: plant-bridge
    keep_alive: 10s
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
    lease_ttl: TTL
    step_down_grace: 1s
    broker_health_step_down: 2s
    failover_slo: SLO
`

const e2eOpAMP = `opamp:
  server_url: ws://OPAMP/v1/opamp
  enrollment_secret_env: MYRIARCH_E2E_SECRET
  heartbeat_interval: 1s
`

const e2eSecondRoute = `  - {id: second, type: http, http: {url: "SINK2"}, retry: {max_attempts: 10, initial_backoff: 10ms}}
routes:
  - id: r2
    receiver: in
    senders: [second]
    lease_ttl: TTL
    step_down_grace: 1s
    broker_health_step_down: 2s
    failover_slo: SLO
`

type seqSink struct {
	mu   sync.Mutex
	seen map[int]int
	srv  *httptest.Server
}

func newSeqSink(t *testing.T) *seqSink {
	s := &seqSink{seen: map[int]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		n, err := strconv.Atoi(string(b))
		if err == nil {
			s.mu.Lock()
			s.seen[n]++
			s.mu.Unlock()
		}
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// missing returns the numbers in [from, to) not delivered.
func (s *seqSink) missing(from, to int) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int
	for i := from; i < to; i++ {
		if s.seen[i] == 0 {
			out = append(out, i)
		}
	}
	return out
}

type connCounter struct {
	mochi.HookBase
	mu sync.Mutex
	n  int
}

func (*connCounter) ID() string           { return "e2e-connects" }
func (*connCounter) Provides(b byte) bool { return b == mochi.OnSessionEstablished }
func (c *connCounter) OnSessionEstablished(cl *mochi.Client, _ packets.Packet) {
	if strings.HasPrefix(cl.ID, "plant-bridge") {
		c.mu.Lock()
		c.n++
		c.mu.Unlock()
	}
}
func (c *connCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

type bridgeProc struct {
	dir string
	cmd *exec.Cmd
	uid string
}

func startBridgeProc(t *testing.T, dir, body string) *bridgeProc {
	t.Helper()
	file := filepath.Join(dir, "bridge.yaml")
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "bridge.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "run", "-c", file)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "MYRIARCH_BRIDGE_TEST_MAIN=1", "MYRIARCH_E2E_SECRET="+e2eSecret)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &bridgeProc{dir: dir, cmd: cmd}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			t.Logf("%s:\n%s", dir, b)
		}
	})
	return p
}

// session is the session component of an agent's health report.
func session(a store.Agent) map[string]string {
	var h struct {
		Components map[string]struct {
			Status string `json:"status"`
		} `json:"components"`
	}
	_ = json.Unmarshal(a.Health, &h)
	return bridgeopamp.ParseStatusText(h.Components[bridgeopamp.ComponentPrefix+"plant"].Status)
}

func eventually(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBridgesManagedByMyriarchd is the end-to-end test of issue 13:
// myriarchd on a real PostgreSQL, two bridge processes sharing a lease
// store, an embedded broker. A configuration that adds a route reaches
// both bridges and the exclusive session stays with its owner (same lease
// version, no reconnect) with no message lost; a configuration refused by
// admission is reported FAILED by both and changes nothing; a change of
// the session's cadence hands it over once, within its budget.
func TestBridgesManagedByMyriarchd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, myriarchd and two bridge processes")
	}
	ctx := context.Background()
	d, tok := startMyriarchd(t, "e2e")
	api := "http://" + d.HTTPAddr().String()

	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	conns := &connCounter{}
	if err := br.Server.AddHook(conns, nil); err != nil {
		t.Fatal(err)
	}
	sk, sk2 := newSeqSink(t), newSeqSink(t)
	root := t.TempDir()
	render := func(ttl, slo string, second bool) string {
		y := e2eConfig
		if second {
			y = strings.Replace(y, "routes:\n", e2eSecondRoute, 1)
		}
		return strings.NewReplacer("LEASEDB", filepath.Join(root, "lease.db"), "BROKER", br.URL, "SINK2", sk2.srv.URL,
			"SINK", sk.srv.URL, "TTL", ttl, "SLO", slo).Replace(y)
	}
	local := render("5s", "60s", false) + strings.ReplaceAll(e2eOpAMP, "OPAMP", d.OpAMPAddr().String())
	var procs []*bridgeProc
	for _, name := range []string{"a", "b"} {
		dir := filepath.Join(root, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, startBridgeProc(t, dir, local))
	}

	// Both bridges enroll; the agents list filters them.
	agents := func() map[string]store.Agent {
		req, _ := http.NewRequest("GET", api+"/api/v1/agents?kind=bridge", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		var l struct {
			Agents []store.Agent `json:"agents"`
		}
		if json.NewDecoder(resp.Body).Decode(&l) != nil {
			return nil
		}
		out := map[string]store.Agent{}
		for _, a := range l.Agents {
			out[a.InstanceUID] = a
		}
		return out
	}
	for _, p := range procs {
		eventually(t, "the instance uid file of "+p.dir, time.Minute, func() bool {
			b, err := os.ReadFile(filepath.Join(p.dir, "plant-opamp-instance-uid"))
			p.uid = strings.TrimSpace(string(b))
			return err == nil && p.uid != ""
		})
	}
	var owner, standby *bridgeProc
	eventually(t, "one owner at full and one standby, reported to myriarchd", time.Minute, func() bool {
		all := agents()
		if len(all) != 2 {
			return false
		}
		owner, standby = nil, nil
		for _, p := range procs {
			s := session(all[p.uid])
			switch {
			case s["role"] == "owner" && s["service_level"] == "full":
				owner = p
			case s["role"] == "standby":
				standby = p
			}
		}
		return owner != nil && standby != nil
	})
	version := session(agents()[owner.uid])["lease_version"]
	connsBefore := conns.count()

	pubc, err := embroker.Connect(ctx, br.URL, "e2e-publisher", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pubc.Close()
	next := 0
	publish := func(n int) {
		for range n {
			if _, err := pubc.Publish(ctx, &paho.Publish{Topic: "in/x", QoS: 1, Payload: fmt.Append(nil, next)}); err != nil {
				t.Fatal(err)
			}
			next++
		}
	}
	// Publish all along while the configuration changes.
	pubStop, pubDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(pubDone)
		for {
			select {
			case <-pubStop:
				return
			case <-time.After(5 * time.Millisecond):
				publish(1)
			}
		}
	}()
	stopPublishing := func() {
		close(pubStop)
		<-pubDone
	}

	push := func(p *bridgeProc, body string) string {
		hash, err := d.Store.SetDesiredConfig(ctx, p.uid, body)
		if err != nil {
			t.Fatal(err)
		}
		return hash
	}
	reported := func(p *bridgeProc, hash, status string) func() bool {
		return func() bool {
			a := agents()[p.uid]
			return a.RemoteConfigHash == hash && a.RemoteConfigStatus == status
		}
	}

	// 1. A new route reaches both; the owner keeps lease and connection.
	withRoute := render("5s", "60s", true)
	for _, p := range procs {
		h := push(p, withRoute)
		eventually(t, "the new route applied on "+p.dir, time.Minute, reported(p, h, "applied"))
	}
	time.Sleep(500 * time.Millisecond)
	stopPublishing()
	eventually(t, "every message delivered across the reload", time.Minute, func() bool { return len(sk.missing(0, next)) == 0 })
	eventually(t, "the new route delivers", time.Minute, func() bool { return len(sk2.missing(next-1, next)) == 0 })
	if s := session(agents()[owner.uid]); s["role"] != "owner" || s["lease_version"] != version {
		t.Fatalf("after adding a route the owner reports %v; want owner at lease version %s", s, version)
	}
	if n := conns.count(); n != connsBefore {
		t.Fatalf("%d broker sessions established during the reload: the exclusive session reconnected", n-connsBefore)
	}
	for _, p := range procs {
		b, _ := os.ReadFile(filepath.Join(p.dir, "bridge.yaml"))
		if !strings.Contains(string(b), "id: r2") || !strings.Contains(string(b), "opamp:") {
			t.Fatalf("%s on disk after the reload lacks the new route or the local opamp block:\n%s", p.dir, b)
		}
	}
	if ec := agents()[owner.uid].EffectiveConfig; !strings.Contains(ec, "id: r2") {
		t.Fatalf("effective config not reported:\n%s", ec)
	}

	// 2. Refused by admission: FAILED with the problem, nothing changes.
	bad := render("5s", "1s", true)
	req, _ := http.NewRequest("PUT", api+"/api/v1/agents/"+owner.uid+"/config", strings.NewReader(`{"config": `+strconv.Quote(bad)+`}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnprocessableEntity || !bytes.Contains(body, []byte("failover_slo")) {
		t.Fatalf("myriarchd's API let a bridge configuration through that the bridge's check refuses: %d %s", resp.StatusCode, body)
	}
	onDisk := map[string][]byte{}
	for _, p := range procs {
		onDisk[p.dir], _ = os.ReadFile(filepath.Join(p.dir, "bridge.yaml"))
	}
	for _, p := range procs {
		// As a myriarchd without the check would deliver it.
		h := push(p, bad)
		eventually(t, "FAILED reported by "+p.dir, time.Minute, reported(p, h, "failed"))
		if e := agents()[p.uid].RemoteConfigError; !strings.Contains(e, "failover_slo") {
			t.Fatalf("%s reported FAILED without the problem: %q", p.dir, e)
		}
	}
	for _, p := range procs {
		if b, _ := os.ReadFile(filepath.Join(p.dir, "bridge.yaml")); !bytes.Equal(b, onDisk[p.dir]) {
			t.Fatalf("a refused configuration changed %s on disk", p.dir)
		}
	}
	if s := session(agents()[owner.uid]); s["role"] != "owner" || s["lease_version"] != version {
		t.Fatalf("after a refused configuration the owner reports %v", s)
	}

	// 3. A new cadence: the session hands over once, within its budget.
	// The standby takes it first (as a rollout that orders standbys
	// first would); the owner's step-down is then the one hand-over.
	newCadence := render("6s", "60s", true)
	h := push(standby, newCadence)
	eventually(t, "the standby applied the new cadence", time.Minute, reported(standby, h, "applied"))
	pubStop, pubDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(pubDone)
		for {
			select {
			case <-pubStop:
				return
			case <-time.After(5 * time.Millisecond):
				publish(1)
			}
		}
	}()
	budget, _ := strconv.ParseFloat(session(agents()[owner.uid])["owner_death_budget_s"], 64)
	pushed := time.Now()
	h = push(owner, newCadence)
	want, _ := strconv.Atoi(version)
	var handedOver time.Duration
	eventually(t, "the session served again at the next lease version", time.Minute, func() bool {
		for _, p := range procs {
			s := session(agents()[p.uid])
			if s["role"] == "owner" && s["service_level"] == "full" && s["lease_version"] == strconv.Itoa(want+1) {
				handedOver = time.Since(pushed)
				return true
			}
		}
		return false
	})
	eventually(t, "the owner applied the new cadence", time.Minute, reported(owner, h, "applied"))
	stopPublishing()
	t.Logf("cadence change: served again at lease version %d %.2fs after the push (owner-death budget %.1fs)", want+1, handedOver.Seconds(), budget)
	if budget <= 0 || handedOver.Seconds() > budget {
		t.Fatalf("hand-over took %.2fs; budget %.1fs", handedOver.Seconds(), budget)
	}
	eventually(t, "every message delivered across the hand-over", time.Minute, func() bool { return len(sk.missing(0, next)) == 0 })
	time.Sleep(2 * time.Second) // a second hand-over would show by now
	for _, p := range procs {
		if v := session(agents()[p.uid])["lease_version"]; v != "" && v != strconv.Itoa(want+1) {
			t.Fatalf("%s reports lease version %s; want exactly one hand-over (%d)", p.dir, v, want+1)
		}
	}
}

// startMyriarchd runs one myriarchd replica (named replica) on a throwaway
// PostgreSQL until the end of the test, and returns it with an API token;
// extra settings (key=value pairs) override the test defaults.
func startMyriarchd(t *testing.T, replica string, extra ...string) (*daemon.Daemon, string) {
	t.Helper()
	pg := pgtest.New(t)
	settings := map[string]string{
		"database.url": pg.DSN(""), "server.enrollmentSecret": e2eSecret, "ha.replicaId": replica,
		"server.opampListen": "127.0.0.1:0", "server.httpListen": "127.0.0.1:0", "server.shutdownTimeout": "5s",
		"server.lastSeenFlushInterval": "200ms", "database.maxConns": "8"}
	for _, kv := range extra {
		k, v, _ := strings.Cut(kv, "=")
		settings[k] = v
	}
	fc, err := fleetconfig.Load(fleetconfig.Source{Environ: []string{}, Overrides: settings})
	if err != nil {
		t.Fatal(err)
	}
	d, err := daemon.Start(context.Background(), daemon.Options{Config: fc, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Version: "e2e"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Shutdown() })
	tok, err := d.Store.CreateToken(context.Background(), "e2e")
	if err != nil {
		t.Fatal(err)
	}
	return d, tok
}
