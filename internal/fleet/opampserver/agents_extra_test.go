package opampserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/open-telemetry/opamp-go/protobufs"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	"github.com/myriarch/myriarch/internal/faultnet"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/internal/testnet"
)

func openStore(t *testing.T) *store.Store {
	t.Helper()
	pg := pgtest.New(t)
	st, err := store.Open(context.Background(), pg.DSN(""), 8, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

func startAgent(t *testing.T, o fleettest.AgentOptions) *fleettest.Agent {
	t.Helper()
	o.Secret = secret
	a, err := fleettest.StartAgent(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Stop(context.Background()) })
	return a
}

func eventsOf(t *testing.T, r *rig, uid string) []store.Event {
	t.Helper()
	ctx := context.Background()
	if err := r.b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	evs, err := r.st.Events(ctx, uid, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func countKind(evs []store.Event, kind string) int {
	n := 0
	for _, e := range evs {
		if e.Kind == kind {
			n++
		}
	}
	return n
}

// known reports whether the server has the agent's full state on its
// current connection (WebSocket) or poll bookkeeping (plain HTTP).
func (s *Server) known(uid string) bool {
	s.mu.Lock()
	ac, ha := s.byUID[uid], s.http[uid]
	s.mu.Unlock()
	switch {
	case ac != nil:
		ac.mu.Lock()
		defer ac.mu.Unlock()
		return ac.seen.known
	case ha != nil:
		ha.mu.Lock()
		defer ha.mu.Unlock()
		return ha.rep.known
	}
	return false
}

// The regression found with the OpenTelemetry supervisor: after a
// reconnect (here a replica restart) the server must not send the desired
// config again before the agent has said which one it runs. The old code
// did, in its reply to the first message, so the supervisor reported a
// FAILED config as APPLIED, and healthy agents got a spurious
// config_sent/config_applied pair on every reconnect.
func TestReconnectSendsNothingBeforeTheReportedHash(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	r1 := newRig(t, st, "replica-a", "n1")
	// The agents know the address of a relay bound by the test: the
	// restarted replica comes up on a fresh port behind it, where
	// restarting on r1's released port could find it taken.
	relay := testnet.NewRelay(t, r1.srv.Addr().String())
	ws, url := "ws://"+relay.Addr()+"/v1/opamp", "http://"+relay.Addr()+"/v1/opamp"

	failing := startAgent(t, fleettest.AgentOptions{URL: ws, FailConfig: true})
	healthy := startAgent(t, fleettest.AgentOptions{URL: ws})
	httpFailing := startAgent(t, fleettest.AgentOptions{URL: url, HTTP: true, Heartbeat: 50 * time.Millisecond, FailConfig: true})
	changed := startAgent(t, fleettest.AgentOptions{URL: ws})
	all := []*fleettest.Agent{failing, healthy, httpFailing, changed}
	for _, a := range all {
		agentIs(t, st, a.UIDString(), func(a store.Agent) bool { return a.Status == "online" && a.Healthy != nil })
		if _, err := st.SetDesiredConfig(ctx, a.UIDString(), "receivers: {otlp: {}}\n"); err != nil {
			t.Fatal(err)
		}
		r1.srv.Push(ctx, a.UIDString())
	}
	for _, a := range []*fleettest.Agent{failing, httpFailing} {
		agentIs(t, st, a.UIDString(), func(a store.Agent) bool { return a.RemoteConfigStatus == "failed" })
	}
	for _, a := range []*fleettest.Agent{healthy, changed} {
		agentIs(t, st, a.UIDString(), func(a store.Agent) bool { return a.RemoteConfigStatus == "applied" })
	}
	before := map[string]int{}
	sentBefore := map[string]int{}
	for _, a := range all {
		before[a.UIDString()] = len(a.Configs())
		sentBefore[a.UIDString()] = countKind(eventsOf(t, r1, a.UIDString()), store.EventConfigSent)
	}

	// Restart the replica behind the same address.
	relay.SetTarget("")
	r1.stop(t)
	fctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := r1.srv.FinalFlush(fctx); err != nil {
		t.Fatal(err)
	}
	// A change made while the agent was away still reaches it.
	newHash, err := st.SetDesiredConfig(ctx, changed.UIDString(), "receivers: {otlp: {protocols: {grpc: {}}}}\n")
	if err != nil {
		t.Fatal(err)
	}
	r2 := newRig(t, st, "replica-a", "n2")
	defer r2.stop(t)
	relay.SetTarget(r2.srv.Addr().String())
	for _, a := range all {
		uid := a.UIDString()
		if !fleettest.Eventually(60*time.Second, func() bool { return r2.srv.known(uid) }) {
			t.Fatalf("agent %s never reported its full state to the restarted replica", uid)
		}
	}
	agentIs(t, st, changed.UIDString(), func(a store.Agent) bool {
		return a.RemoteConfigStatus == "applied" && a.RemoteConfigHash == newHash
	})
	// Some more polls and heartbeats: nothing may arrive late either.
	if err := r2.srv.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	for _, a := range []*fleettest.Agent{failing, healthy, httpFailing} {
		uid := a.UIDString()
		if n := len(a.Configs()); n != before[uid] {
			t.Errorf("agent %s was sent its unchanged config again after the reconnect (%d configs, %d before)", uid, n, before[uid])
		}
		if n := countKind(eventsOf(t, r2, uid), store.EventConfigSent); n != sentBefore[uid] {
			t.Errorf("agent %s: %d config_sent events, %d before the reconnect", uid, n, sentBefore[uid])
		}
	}
	for _, a := range []*fleettest.Agent{failing, httpFailing} {
		got, _ := st.GetAgent(ctx, a.UIDString())
		if got.RemoteConfigStatus != "failed" {
			t.Errorf("agent %s: status %q after the reconnect, want failed", a.UIDString(), got.RemoteConfigStatus)
		}
	}
	if n := len(changed.Configs()); n != before[changed.UIDString()]+1 {
		t.Errorf("changed agent got %d configs, want %d", n, before[changed.UIDString()]+1)
	}
}

// health_changed is recorded when the error text changes, not only when
// healthy flips, and the component health is stored nested.
func TestHealthEventsOnErrorChangeAndComponentHealth(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	r := newRig(t, st, "replica-a", "n1")
	defer r.stop(t)
	a := startAgent(t, fleettest.AgentOptions{URL: r.ws})
	uid := a.UIDString()
	agentIs(t, st, uid, func(a store.Agent) bool { return a.Healthy != nil && *a.Healthy })
	for _, e := range []string{"exporter otlp: connection refused", "receiver otlp: bind: address already in use"} {
		err := a.Client.SetHealth(&protobufs.ComponentHealth{Healthy: false, LastError: e, Status: "StatusRecoverableError",
			ComponentHealthMap: map[string]*protobufs.ComponentHealth{"pipeline:traces": {Healthy: false, Status: "StatusRecoverableError",
				ComponentHealthMap: map[string]*protobufs.ComponentHealth{"receiver:otlp": {Healthy: false, LastError: e}}}}})
		if err != nil {
			t.Fatal(err)
		}
		agentIs(t, st, uid, func(a store.Agent) bool { return strings.Contains(string(a.Health), e) })
	}
	var evs []store.Event
	if !fleettest.Eventually(30*time.Second, func() bool {
		evs = eventsOf(t, r, uid)
		return countKind(evs, store.EventHealthChanged) >= 2
	}) {
		t.Fatalf("want a health_changed event per error text: %+v", evs)
	}
	if evs[0].Kind != store.EventHealthChanged || !strings.Contains(evs[0].Detail, "address already in use") {
		t.Fatalf("newest event: %+v", evs[0])
	}
	got, _ := st.GetAgent(ctx, uid)
	var h struct {
		Components map[string]struct {
			Healthy    bool `json:"healthy"`
			Components map[string]struct {
				LastError string `json:"last_error"`
			} `json:"components"`
		} `json:"components"`
	}
	if err := json.Unmarshal(got.Health, &h); err != nil {
		t.Fatal(err)
	}
	if c := h.Components["pipeline:traces"].Components["receiver:otlp"]; !strings.Contains(c.LastError, "address already in use") {
		t.Fatalf("nested component health lost: %s", got.Health)
	}
	// The same report again is no new event.
	n := countKind(eventsOf(t, r, uid), store.EventHealthChanged)
	if err := a.Client.SetHealth(&protobufs.ComponentHealth{Healthy: false, LastError: "receiver otlp: bind: address already in use", Status: "x"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if m := countKind(eventsOf(t, r, uid), store.EventHealthChanged); m != n {
		t.Fatalf("unchanged health recorded again: %d → %d", n, m)
	}
}

// A planned stop closes WebSocket agents with a close frame (1001), not
// by dropping the TCP connection (which agents log as 1006).
func TestStopSendsCloseFrame(t *testing.T) {
	st := openStore(t)
	r := newRig(t, st, "replica-a", "n1")
	h := http.Header{"Authorization": []string{"Bearer " + secret}}
	c, _, err := websocket.DefaultDialer.Dial(r.ws, h)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg, _ := proto.Marshal(&protobufs.AgentToServer{InstanceUid: make([]byte, 16)})
	if err := c.WriteMessage(websocket.BinaryMessage, append([]byte{0}, msg...)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.ReadMessage(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); r.stop(t) }()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		_, _, err = c.ReadMessage()
		if err != nil {
			break
		}
	}
	<-done
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.CloseGoingAway {
		t.Fatalf("want close frame 1001 going away, got %v", err)
	}
}

// A restart requested through the store reaches the agent as a
// ServerToAgentCommand, exactly once, over WebSocket and plain HTTP; an
// agent without AcceptsRestartCommand gets none.
func TestRestartCommand(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	r := newRig(t, st, "replica-a", "n1")
	defer r.stop(t)
	var wsCmds, httpCmds atomic.Int64
	count := func(n *atomic.Int64) func(*protobufs.ServerToAgentCommand) {
		return func(c *protobufs.ServerToAgentCommand) {
			if c.Type == protobufs.CommandType_CommandType_Restart {
				n.Add(1)
			}
		}
	}
	ws := startAgent(t, fleettest.AgentOptions{URL: r.ws, OnCommand: count(&wsCmds)})
	hp := startAgent(t, fleettest.AgentOptions{URL: r.url, HTTP: true, Heartbeat: 50 * time.Millisecond, OnCommand: count(&httpCmds)})
	noCap := startAgent(t, fleettest.AgentOptions{URL: r.ws})
	for _, a := range []*fleettest.Agent{ws, hp, noCap} {
		uid := a.UIDString()
		agentIs(t, st, uid, func(a store.Agent) bool { return a.Status == "online" && a.Capabilities != 0 })
		if !fleettest.Eventually(30*time.Second, func() bool { return r.srv.known(uid) }) {
			t.Fatal("full state never arrived")
		}
		if _, err := st.RequestRestart(ctx, uid); err != nil {
			t.Fatal(err)
		}
		r.srv.Push(ctx, store.RestartNotifyPrefix+uid)
	}
	for name, n := range map[string]*atomic.Int64{"websocket": &wsCmds, "http": &httpCmds} {
		if !fleettest.Eventually(30*time.Second, func() bool { return n.Load() == 1 }) {
			t.Fatalf("%s agent: %d restart commands", name, n.Load())
		}
	}
	// Neither a reconcile nor more polls send it again.
	if err := r.srv.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if wsCmds.Load() != 1 || httpCmds.Load() != 1 {
		t.Fatalf("restart sent more than once: ws %d, http %d", wsCmds.Load(), httpCmds.Load())
	}
	for _, a := range []*fleettest.Agent{ws, hp} {
		if evs := eventsOf(t, r, a.UIDString()); countKind(evs, store.EventRestartSent) != 1 || countKind(evs, store.EventRestartRequested) != 1 {
			t.Fatalf("events: %+v", evs)
		}
	}
	if evs := eventsOf(t, r, noCap.UIDString()); countKind(evs, store.EventRestartSent) != 0 {
		t.Fatalf("restart sent to an agent that does not accept it: %+v", evs)
	}
	// A lost notification: the reconcile delivers the request.
	if _, err := st.RequestRestart(ctx, ws.UIDString()); err != nil {
		t.Fatal(err)
	}
	if err := r.srv.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if !fleettest.Eventually(30*time.Second, func() bool { return wsCmds.Load() == 2 }) {
		t.Fatalf("reconcile did not deliver a restart: %d", wsCmds.Load())
	}
}

// A plain-HTTP agent's first poll is a connect, with its event; a cleared
// desired config reaches an agent as an empty config map.
func TestHTTPConnectedEventAndClearedConfig(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	r := newRig(t, st, "replica-a", "n1")
	defer r.stop(t)
	hp := startAgent(t, fleettest.AgentOptions{URL: r.url, HTTP: true, Heartbeat: 50 * time.Millisecond})
	ws := startAgent(t, fleettest.AgentOptions{URL: r.ws})
	agentIs(t, st, hp.UIDString(), func(a store.Agent) bool { return a.Status == "online" })
	if evs := eventsOf(t, r, hp.UIDString()); countKind(evs, store.EventConnected) != 1 {
		t.Fatalf("plain-HTTP agent: want one connected event, got %+v", evs)
	}
	for _, a := range []*fleettest.Agent{hp, ws} {
		uid := a.UIDString()
		agentIs(t, st, uid, func(a store.Agent) bool { return a.Healthy != nil })
		if _, err := st.SetDesiredConfig(ctx, uid, "a: 1\n"); err != nil {
			t.Fatal(err)
		}
		r.srv.Push(ctx, uid)
		agentIs(t, st, uid, func(a store.Agent) bool { return a.RemoteConfigStatus == "applied" && a.EffectiveConfig == "a: 1\n" })
		cleared, err := st.SetDesiredConfig(ctx, uid, "")
		if err != nil {
			t.Fatal(err)
		}
		r.srv.Push(ctx, uid)
		agentIs(t, st, uid, func(a store.Agent) bool { return a.RemoteConfigStatus == "applied" && a.RemoteConfigHash == cleared })
		if c := a.Configs(); len(c) != 2 || c[1] != "" {
			t.Fatalf("agent %s configs %q, want the cleared (empty) one last", uid, c)
		}
	}
}

// A plain-HTTP agent behind a balancer polls both replicas: the one that
// delivered a config often does not see the report that the agent
// applied it (that poll went to the other one). It must still not send
// the config again: the agent gets each config once. The balancer here
// sends each new connection to the next replica, and the test cuts the
// agent's connection after every poll or so.
func TestPlainHTTPAgentBehindABalancerGetsAConfigOnce(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	ra, rb := newRig(t, st, "replica-a", "na"), newRig(t, st, "replica-b", "nb")
	defer ra.stop(t)
	defer rb.stop(t)
	px, err := faultnet.Listen(faultnet.Options{}, ra.srv.Addr().String(), rb.srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	stop := make(chan struct{})
	cutter := make(chan struct{})
	go func() {
		defer close(cutter)
		for {
			select {
			case <-stop:
				return
			case <-time.After(60 * time.Millisecond):
				px.Cut()
			}
		}
	}()
	defer func() { close(stop); <-cutter }()
	a := startAgent(t, fleettest.AgentOptions{URL: "http://" + px.Addr() + "/v1/opamp", HTTP: true, Heartbeat: 50 * time.Millisecond})
	uid := a.UIDString()
	agentIs(t, st, uid, func(ag store.Agent) bool { return ag.Status == "online" })
	for rev := 1; rev <= 3; rev++ {
		body := fmt.Sprintf("receivers: {otlp: {}}\n# rev %d\n", rev)
		hash, err := st.SetDesiredConfig(ctx, uid, body)
		if err != nil {
			t.Fatal(err)
		}
		ra.srv.Push(ctx, uid)
		rb.srv.Push(ctx, uid)
		agentIs(t, st, uid, func(ag store.Agent) bool { return ag.RemoteConfigHash == hash && ag.RemoteConfigStatus == "applied" })
		// Polls to both replicas after the report: none may bring it again.
		polls := func() float64 { return testutil.ToFloat64(ra.srv.mMessages) + testutil.ToFloat64(rb.srv.mMessages) }
		p0 := polls()
		if !fleettest.Eventually(30*time.Second, func() bool { return polls() >= p0+20 }) {
			t.Fatalf("rev %d: the agent stopped polling", rev)
		}
		got := 0
		for _, c := range a.Configs() {
			if c == body {
				got++
			}
		}
		if got != 1 {
			t.Fatalf("rev %d: the agent received it %d times, want once", rev, got)
		}
	}
}
