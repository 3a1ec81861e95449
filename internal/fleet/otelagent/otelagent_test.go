package otelagent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/fleet/config"
	"github.com/myriarch/myriarch/internal/fleet/daemon"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/otelagent"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const secret = "0123456789abcdef-otel-secret"

// replica starts a myriarchd replica whose OpAMP listener is at opampAddr.
func replica(t *testing.T, dsn, id, opampAddr string) *daemon.Daemon {
	t.Helper()
	cfg, err := config.Load(config.Source{Environ: []string{}, Overrides: map[string]string{
		"database.url": dsn, "server.enrollmentSecret": secret, "ha.replicaId": id,
		"server.opampListen": opampAddr, "server.httpListen": "127.0.0.1:0", "ha.leaderSessionTimeout": "10s",
		"ha.heartbeatInterval": "1s", "server.lastSeenFlushInterval": "200ms",
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := daemon.Start(ctx, daemon.Options{Config: cfg, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Version: "otel-test"})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

type api struct {
	t     *testing.T
	base  string
	token string
}

func (a api) call(method, path, body string, out any) int {
	a.t.Helper()
	req, _ := http.NewRequest(method, a.base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			a.t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	if resp.StatusCode >= 300 && !(method == "GET" && resp.StatusCode == http.StatusNotFound) {
		a.t.Logf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	return resp.StatusCode
}

type detail struct {
	Agent struct {
		store.Agent
		CapabilityNames []string `json:"capability_names"`
	} `json:"agent"`
	Events []store.Event `json:"events"`
}

func (a api) agent(uid string) detail {
	a.t.Helper()
	var d detail
	if code := a.call("GET", "/api/v1/agents/"+uid, "", &d); code != http.StatusOK {
		a.t.Fatalf("GET agent %s: %d", uid, code)
	}
	return d
}

// until polls the agent through the API until cond holds (generous
// limit: a collector restart takes seconds on a loaded machine).
func (a api) until(what, uid string, cond func(detail) bool) detail {
	a.t.Helper()
	var d detail
	if !fleettest.Eventually(90*time.Second, func() bool {
		// Not found until the supervisor's first message was stored.
		var got detail
		if a.call("GET", "/api/v1/agents/"+uid, "", &got) != http.StatusOK {
			return false
		}
		d = got
		return cond(d)
	}) {
		b, _ := json.MarshalIndent(d, "", "  ")
		a.t.Fatalf("agent %s: never %s; last:\n%s", uid, what, b)
	}
	return d
}

func (a api) setConfig(uid, body string) string {
	a.t.Helper()
	b, _ := json.Marshal(map[string]string{"config": body})
	var out struct {
		Hash string `json:"config_hash"`
	}
	if code := a.call("PUT", "/api/v1/agents/"+uid+"/config", string(b), &out); code != http.StatusAccepted {
		a.t.Fatalf("PUT config: %d", code)
	}
	return out.Hash
}

func count(evs []store.Event, kind string) int {
	n := 0
	for _, e := range evs {
		if e.Kind == kind {
			n++
		}
	}
	return n
}

func healthStart(d detail) float64 {
	var h struct {
		Start float64 `json:"start_time_unix_nano"`
	}
	_ = json.Unmarshal(d.Agent.Health, &h)
	return h.Start
}

// The real agent: the OpenTelemetry OpAMP supervisor v0.149.0 with a
// collector, against myriarchd on a real PostgreSQL. Registration, health,
// effective config, a valid push (APPLIED, healthy), the restart command,
// a broken pipeline (FAILED, unhealthy, the error text in the events) that
// stays FAILED across a replica restart (the regression: the config was
// re-sent before the agent's hash was known and the supervisor reported
// it APPLIED), and clearing the config.
func TestRealSupervisor(t *testing.T) {
	otelagent.Binaries(t)
	pg := pgtest.New(t)
	// Port 0: a port found free here and bound by the replica a moment
	// later could be taken in between. The restart below reuses the port
	// the first replica bound.
	d1 := replica(t, pg.DSN(""), "replica-a", "127.0.0.1:0")
	opampAddr := d1.OpAMPAddr().String()
	stopped := false
	defer func() {
		if !stopped {
			d1.Shutdown()
		}
	}()
	tok, err := d1.Store.CreateToken(context.Background(), "otel-test")
	if err != nil {
		t.Fatal(err)
	}
	c := api{t: t, base: "http://" + d1.HTTPAddr().String(), token: tok}

	sup := otelagent.Start(t, "ws://"+opampAddr+"/v1/opamp", otelagent.Options{Secret: secret})
	uid := sup.InstanceUID()

	// Registration, health, effective config, capabilities by name.
	a := c.until("registered and healthy", uid, func(d detail) bool {
		return d.Agent.Status == "online" && d.Agent.Healthy != nil && *d.Agent.Healthy && d.Agent.EffectiveConfig != ""
	})
	t.Logf("registered: %v, capabilities %v", a.Agent.Identifying, a.Agent.CapabilityNames)
	if a.Agent.Identifying["service.name"] == "" {
		t.Errorf("no service.name: %+v", a.Agent.Identifying)
	}
	for _, want := range []string{"AcceptsRemoteConfig", "AcceptsRestartCommand", "ReportsHealth", "ReportsEffectiveConfig"} {
		if !strings.Contains(strings.Join(a.Agent.CapabilityNames, ","), want) {
			t.Errorf("capability_names %v lacks %s", a.Agent.CapabilityNames, want)
		}
	}

	// A valid pipeline: APPLIED and healthy, in the effective config.
	port := otelagent.FreePort(t)
	good := c.setConfig(uid, otelagent.PipelineConfig(port))
	a = c.until("applied the valid config", uid, func(d detail) bool {
		return d.Agent.RemoteConfigStatus == "applied" && d.Agent.RemoteConfigHash == good &&
			d.Agent.Healthy != nil && *d.Agent.Healthy && strings.Contains(d.Agent.EffectiveConfig, fmt.Sprintf("127.0.0.1:%d", port))
	})
	// The collector really runs it: the OTLP/HTTP receiver answers.
	if !fleettest.Eventually(60*time.Second, func() bool {
		resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/traces", port), "application/json", bytes.NewReader([]byte(`{"resourceSpans":[]}`)))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}) {
		t.Fatal("the collector's OTLP receiver from the pushed config never answered")
	}

	// The restart command: the collector starts again (a new start time).
	start := healthStart(a)
	if code := c.call("POST", "/api/v1/agents/"+uid+"/restart", "", nil); code != http.StatusAccepted {
		t.Fatalf("restart: %d", code)
	}
	c.until("restarted", uid, func(d detail) bool {
		return count(d.Events, store.EventRestartSent) == 1 && healthStart(d) != start && d.Agent.Healthy != nil && *d.Agent.Healthy
	})

	// A broken pipeline: FAILED, unhealthy, the error text recorded.
	bad := c.setConfig(uid, otelagent.BrokenPipelineConfig(port))
	a = c.until("failed the broken config", uid, func(d detail) bool {
		return d.Agent.RemoteConfigStatus == "failed" && d.Agent.RemoteConfigHash == bad && d.Agent.RemoteConfigError != ""
	})
	t.Logf("broken config reported: %s; health %s", a.Agent.RemoteConfigError, a.Agent.Health)
	c.until("recorded the collector's error text", uid, func(d detail) bool {
		for _, e := range d.Events {
			if e.Kind == store.EventHealthChanged && strings.Contains(e.Detail, "healthy=false ") {
				return !*d.Agent.Healthy
			}
		}
		return false
	})

	// Restart the replica at the same address: the config stays FAILED.
	if err := d1.Shutdown(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	d2 := replica(t, pg.DSN(""), "replica-b", opampAddr)
	defer d2.Shutdown()
	c.base = "http://" + d2.HTTPAddr().String()
	c.until("reconnected to the restarted replica", uid, func(d detail) bool {
		return d.Agent.Status == "online" && d.Agent.ReplicaID == "replica-b"
	})
	// The old code re-sent the config in its first reply and the
	// supervisor reported APPLIED within a second: watch for a while.
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		a = c.agent(uid)
		if a.Agent.RemoteConfigStatus != "failed" || a.Agent.RemoteConfigHash != bad {
			t.Fatalf("after the replica restart the broken config is %q (hash %s), want failed", a.Agent.RemoteConfigStatus, a.Agent.RemoteConfigHash)
		}
		time.Sleep(250 * time.Millisecond)
	}
	sentAfter := 0
	for _, e := range a.Events {
		if e.Kind == store.EventConfigSent && e.ReplicaID == "replica-b" {
			sentAfter++
		}
	}
	if sentAfter != 0 {
		t.Errorf("the restarted replica sent the unchanged config again (%d config_sent events)", sentAfter)
		for _, e := range a.Events {
			t.Logf("event %s %s %s %s", e.At.Format(time.StampMilli), e.ReplicaID, e.Kind, e.Detail)
		}
	}

	// Clearing the config: the agent is sent an empty config and reports it.
	if code := c.call("DELETE", "/api/v1/agents/"+uid+"/config", "", nil); code != http.StatusAccepted {
		t.Fatalf("clear: %d", code)
	}
	c.until("applied the cleared config", uid, func(d detail) bool {
		return d.Agent.RemoteConfigStatus == "applied" && d.Agent.RemoteConfigHash == store.ConfigHash("")
	})
}

// The supervisor over plain HTTP: registered, healthy, and its first poll
// recorded as a connect (plain-HTTP agents had no connected event). Its
// poll interval is opamp-go's 30 s, so config pushes are tested over
// WebSocket above and over plain HTTP with opamp-go agents in
// internal/fleet/opampserver.
func TestRealSupervisorOverPlainHTTP(t *testing.T) {
	otelagent.Binaries(t)
	pg := pgtest.New(t)
	d := replica(t, pg.DSN(""), "replica-h", "127.0.0.1:0")
	defer d.Shutdown()
	tok, err := d.Store.CreateToken(context.Background(), "otel-test")
	if err != nil {
		t.Fatal(err)
	}
	c := api{t: t, base: "http://" + d.HTTPAddr().String(), token: tok}
	sup := otelagent.Start(t, "http://"+d.OpAMPAddr().String()+"/v1/opamp", otelagent.Options{Secret: secret})
	uid := sup.InstanceUID()
	c.until("registered over plain HTTP with a connected event", uid, func(d detail) bool {
		return d.Agent.Status == "online" && d.Agent.Healthy != nil && count(d.Events, store.EventConnected) == 1 &&
			d.Agent.Identifying["service.name"] != ""
	})
}

// With validate_config the supervisor refuses a broken pipeline before
// running it and reports the collector's own error text, which myriarchd
// stores and shows; the collector keeps running its previous config.
func TestRealSupervisorValidatesConfig(t *testing.T) {
	otelagent.Binaries(t)
	pg := pgtest.New(t)
	d := replica(t, pg.DSN(""), "replica-v", "127.0.0.1:0")
	defer d.Shutdown()
	tok, err := d.Store.CreateToken(context.Background(), "otel-test")
	if err != nil {
		t.Fatal(err)
	}
	c := api{t: t, base: "http://" + d.HTTPAddr().String(), token: tok}
	sup := otelagent.Start(t, "ws://"+d.OpAMPAddr().String()+"/v1/opamp", otelagent.Options{Secret: secret, ValidateConfig: true})
	uid := sup.InstanceUID()
	c.until("registered", uid, func(d detail) bool { return d.Agent.Status == "online" && d.Agent.Healthy != nil })
	bad := c.setConfig(uid, otelagent.BrokenPipelineConfig(otelagent.FreePort(t)))
	a := c.until("refused the broken config", uid, func(d detail) bool {
		return d.Agent.RemoteConfigStatus == "failed" && d.Agent.RemoteConfigHash == bad
	})
	if !strings.Contains(a.Agent.RemoteConfigError, "otlp/missing") {
		t.Errorf("remote config error %q does not name the missing exporter", a.Agent.RemoteConfigError)
	}
	t.Logf("validation error: %s", a.Agent.RemoteConfigError)
}

// Three supervisors started at the same moment on one host all start on
// their one attempt, and myriarchd sees three healthy collectors. Before
// the fixes of package otelagent's doc, the second and third collectors
// could not bind localhost:8888 (the first held it) and their
// supervisors gave up after bootstrap_timeout, and a start whose
// feature-gate probe lost the collector's output failed at once (the
// collector lacked the nop pipeline the supervisor then bootstraps with).
func TestSupervisorsStartTogether(t *testing.T) {
	otelagent.Binaries(t)
	pg := pgtest.New(t)
	d := replica(t, pg.DSN(""), "replica-t", "127.0.0.1:0")
	defer d.Shutdown()
	tok, err := d.Store.CreateToken(context.Background(), "otel-test")
	if err != nil {
		t.Fatal(err)
	}
	c := api{t: t, base: "http://" + d.HTTPAddr().String(), token: tok}
	const n = 3
	sups := make([]*otelagent.Supervisor, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			// Start fails the test if one does not connect (it does
			// not retry); nonFatal lets it do so from this goroutine.
			sups[i] = otelagent.Start(nonFatal{t}, "ws://"+d.OpAMPAddr().String()+"/v1/opamp", otelagent.Options{Secret: secret})
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for _, s := range sups {
		c.until("registered and healthy", s.InstanceUID(), func(d detail) bool {
			return d.Agent.Status == "online" && d.Agent.Healthy != nil && *d.Agent.Healthy
		})
		if strings.Contains(s.Log(), "address already in use") {
			t.Errorf("a collector could not bind an address:\n%s", s.Log())
		}
	}
}

// nonFatal lets a helper that calls Fatal run on a goroutine other than
// the test's: Fatal marks the test failed and ends that goroutine only
// (testing.T's FailNow must be called from the test's own goroutine).
type nonFatal struct{ *testing.T }

func (n nonFatal) Fatal(args ...any) {
	n.T.Helper()
	n.T.Error(args...)
	runtime.Goexit()
}

func (n nonFatal) Fatalf(format string, args ...any) {
	n.T.Helper()
	n.T.Errorf(format, args...)
	runtime.Goexit()
}
