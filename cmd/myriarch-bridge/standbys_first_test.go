package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// maxHandoverGap is the bound of issue 23 on the owner hand-over of a
// standbys-first rollout, at the point of action: the destination's last
// delivery by the old owner → its first delivery by the new one. The
// planned-stop fast path (docs/bridge.md "Planned stop") measures
// 0.01–0.09 s; an owner that vanished instead would cost a lease TTL (6 s
// here), so the bound tells the two apart.
const maxHandoverGap = 500 * time.Millisecond

// stampSink is the destination: an HTTP sink that records, for every
// delivery, its sequence number, the fencing stamp's lease version (which
// owner delivered it) and when it arrived.
type stampSink struct {
	mu  sync.Mutex
	got []delivery
	srv *httptest.Server
}

type delivery struct {
	seq     int
	version uint64
	at      time.Time
}

func newStampSink(t *testing.T) *stampSink {
	s := &stampSink{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		b, _ := io.ReadAll(r.Body)
		n, err := strconv.Atoi(string(b))
		v, _ := strconv.ParseUint(r.Header.Get(fence.HeaderLeaseVersion), 10, 64)
		if err == nil {
			s.mu.Lock()
			s.got = append(s.got, delivery{seq: n, version: v, at: at})
			s.mu.Unlock()
		}
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *stampSink) deliveries() []delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
}

// missing returns the numbers in [0, n) never delivered.
func (s *stampSink) missing(n int) []int {
	seen := map[int]bool{}
	for _, d := range s.deliveries() {
		seen[d.seq] = true
	}
	var out []int
	for i := range n {
		if !seen[i] {
			out = append(out, i)
		}
	}
	return out
}

// TestStandbysFirstRolloutHandsOverOnceByPlannedStop is the proof of
// issue 23's HA-aware rollouts: a bridge pair (two myriarch-bridge
// processes of bridge id "plant" sharing a sqlite lease store, an embedded
// broker) managed by a real myriarchd on PostgreSQL is rolled out a
// revision that changes the session's cadence (so applying it re-creates
// the exclusive session) with wave order standbys-first. The plan puts the
// standby in the first wave and the owner last; the owner is sent the
// revision only after the standby applied it and is healthy; the owner's
// apply releases the lease by planned stop and the standby, already on the
// new revision, takes over: exactly one hand-over, the destination's gap
// between the old owner's last delivery and the new owner's first within
// maxHandoverGap, and every message of a QoS 1 stream published all along
// delivered.
func TestStandbysFirstRolloutHandsOverOnceByPlannedStop(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, myriarchd and two bridge processes")
	}
	ctx := context.Background()
	d, tok := startMyriarchd(t, "rollout", "jobs.rolloutInterval=200ms")
	api := "http://" + d.HTTPAddr().String()
	call := func(method, path string, body, out any) int {
		t.Helper()
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequest(method, api+path, rd)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if out != nil && json.Unmarshal(b, out) != nil {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
		if resp.StatusCode >= 300 {
			t.Logf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
		return resp.StatusCode
	}

	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	sink := newStampSink(t)
	root := t.TempDir()
	render := func(ttl string) string {
		return strings.NewReplacer("LEASEDB", filepath.Join(root, "lease.db"), "BROKER", br.URL, "SINK", sink.srv.URL,
			"TTL", ttl, "SLO", "60s").Replace(e2eConfig)
	}
	local := render("5s") + strings.ReplaceAll(e2eOpAMP, "OPAMP", d.OpAMPAddr().String())
	var procs []*bridgeProc
	for _, name := range []string{"a", "b"} {
		dir := filepath.Join(root, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, startBridgeProc(t, dir, local))
	}
	for _, p := range procs {
		eventually(t, "the instance uid file of "+p.dir, time.Minute, func() bool {
			b, err := os.ReadFile(filepath.Join(p.dir, "plant-opamp-instance-uid"))
			p.uid = strings.TrimSpace(string(b))
			return err == nil && p.uid != ""
		})
	}
	agent := func(uid string) store.Agent {
		a, _ := d.Store.GetAgent(ctx, uid)
		return a
	}
	var owner, standby *bridgeProc
	eventually(t, "one owner at full and one standby, reported to myriarchd", time.Minute, func() bool {
		owner, standby = nil, nil
		for _, p := range procs {
			s := session(agent(p.uid))
			switch {
			case s["role"] == "owner" && s["service_level"] == "full":
				owner = p
			case s["role"] == "standby":
				standby = p
			}
		}
		return owner != nil && standby != nil
	})
	before, err := strconv.ParseUint(session(agent(owner.uid))["lease_version"], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if a := agent(owner.uid); a.BridgeID() != "plant" || !slices.Equal(a.Roles(), []string{store.RoleOwner}) {
		t.Fatalf("the owner reports bridge id %q, roles %v", a.BridgeID(), a.Roles())
	}

	// The configuration of the pair and a revision that changes the
	// session's cadence (lease_ttl 5s → 6s): applying it re-creates the
	// exclusive session.
	if c := call("PUT", "/api/v1/configs/plant", map[string]any{"type": "myriarch-bridge", "selector": store.BridgeIDAttribute + "=plant"}, nil); c != 201 {
		t.Fatalf("create config: %d", c)
	}
	if c := call("POST", "/api/v1/configs/plant/revisions", map[string]any{"content": render("6s")}, nil); c != 201 {
		t.Fatalf("revision: %d", c)
	}
	req := rollout.Request{Config: "plant", Spec: rollout.Spec{Waves: []string{"1", "100%"}, BakeS: rollout.Secs(1), ApplyTimeoutS: 60,
		Order: rollout.OrderStandbysFirst}}

	// The dry run: the standby first, the owner last.
	var plan rollout.Plan
	if c := call("POST", "/api/v1/rollouts/plan", req, &plan); c != 200 || len(plan.Waves) != 2 ||
		plan.Waves[0].Agents[0].UID != standby.uid || plan.Waves[1].Agents[0].UID != owner.uid ||
		plan.Waves[1].Agents[0].BridgeID != "plant" || !slices.Equal(plan.Waves[1].Agents[0].Roles, []string{store.RoleOwner}) {
		t.Fatalf("plan: %d %+v (standby %s, owner %s)", c, plan, standby.uid, owner.uid)
	}

	// A QoS 1 stream all along the rollout.
	pubc, err := embroker.Connect(ctx, br.URL, "e2e-publisher", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pubc.Close()
	next := 0
	pubStop, pubDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(pubDone)
		for {
			select {
			case <-pubStop:
				return
			case <-time.After(5 * time.Millisecond):
				if _, err := pubc.Publish(ctx, &paho.Publish{Topic: "in/x", QoS: 1, Payload: fmt.Append(nil, next)}); err != nil {
					t.Error(err)
					return
				}
				next++
			}
		}
	}()
	time.Sleep(300 * time.Millisecond)

	var ro rollout.Rollout
	if c := call("POST", "/api/v1/rollouts", req, &ro); c != 202 {
		t.Fatalf("rollout: %d", c)
	}
	var det rollout.Detail
	eventually(t, "the rollout to succeed", 3*time.Minute, func() bool {
		call("GET", fmt.Sprintf("/api/v1/rollouts/%d", ro.ID), nil, &det)
		if det.State != rollout.StateRunning && det.State != rollout.StatePending && det.State != rollout.StateSucceeded {
			t.Fatalf("rollout %s: %s %+v", det.State, det.Reason, det.Agents)
		}
		return det.State == rollout.StateSucceeded
	})
	time.Sleep(500 * time.Millisecond)
	close(pubStop)
	<-pubDone
	eventually(t, "every message delivered", time.Minute, func() bool { return len(sink.missing(next)) == 0 })

	// The owner was sent the revision only after the standby had applied
	// it, one wave later.
	byUID := map[string]rollout.AgentProgress{}
	for _, a := range det.Agents {
		byUID[a.InstanceUID] = a
	}
	so, oo := byUID[standby.uid], byUID[owner.uid]
	if so.Wave != 1 || oo.Wave != 2 || so.State != rollout.AgentApplied || oo.State != rollout.AgentApplied ||
		oo.SentAt == nil || so.ReportedAt == nil || !oo.SentAt.After(*so.ReportedAt) {
		t.Fatalf("standby %+v, owner %+v: the owner must be sent the revision after the standby applied it", so, oo)
	}
	if oo.BridgeID != "plant" || so.BridgeID != "plant" {
		t.Errorf("rollout agents' bridge id: %+v %+v", so, oo)
	}

	// Exactly one hand-over: the destination saw two lease versions, the
	// owner's before and the next; the former standby owns the session.
	var last, first time.Time
	versions := map[uint64]int{}
	for _, x := range sink.deliveries() {
		versions[x.version]++
		switch x.version {
		case before:
			if x.at.After(last) {
				last = x.at
			}
		case before + 1:
			if first.IsZero() || x.at.Before(first) {
				first = x.at
			}
		}
	}
	if len(versions) != 2 || versions[before] == 0 || versions[before+1] == 0 {
		t.Fatalf("lease versions at the destination %v; want %d then %d: exactly one hand-over", versions, before, before+1)
	}
	eventually(t, "the former standby reported as the owner at the next lease version", time.Minute, func() bool {
		s := session(agent(standby.uid))
		return s["role"] == "owner" && s["lease_version"] == strconv.FormatUint(before+1, 10)
	})
	if s := session(agent(owner.uid)); s["role"] != "standby" {
		t.Errorf("the former owner reports %v; want standby", s)
	}
	// By planned stop: the old owner stepped down for the reload (reason
	// shutdown: intake stopped, in-flight settled) and released the lease,
	// rather than losing it to an expiry.
	logb, _ := os.ReadFile(filepath.Join(owner.dir, "bridge.log"))
	if l := string(logb); !strings.Contains(l, `msg="stepping down"`) || !strings.Contains(l, "reason=shutdown version="+strconv.FormatUint(before, 10)) ||
		!strings.Contains(l, `msg="lease released"`) {
		t.Errorf("the old owner's log shows no planned step-down and release of lease version %d", before)
	}
	gap := first.Sub(last)
	t.Logf("standbys-first rollout: owner hand-over lease version %d → %d, destination gap (last delivery by the old owner → first by the new) %.3f s (bound %.1f s); %d messages, none lost, %d deliveries",
		before, before+1, gap.Seconds(), maxHandoverGap.Seconds(), next, len(sink.deliveries()))
	if gap > maxHandoverGap {
		t.Fatalf("hand-over gap %.3f s: more than %.1f s, not the planned-stop fast path", gap.Seconds(), maxHandoverGap.Seconds())
	}
}
