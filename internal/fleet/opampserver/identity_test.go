package opampserver

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/open-telemetry/opamp-go/protobufs"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/lastseen"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// newRigWith is newRig with options of the test's own.
func newRigWith(t *testing.T, st *store.Store, o Options) *rig {
	t.Helper()
	if o.Batcher == nil {
		o.Batcher = lastseen.New(st, time.Hour, nil, nil)
	}
	o.Store, o.Secret = st, secret
	if o.ReplicaID == "" {
		o.ReplicaID, o.Nonce = "r1", "n1"
	}
	srv := New(o)
	if err := srv.Start("127.0.0.1:0", "/v1/opamp", nil); err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr().String()
	return &rig{st: st, b: o.Batcher, srv: srv, ws: "ws://" + addr + "/v1/opamp", url: "http://" + addr + "/v1/opamp"}
}

// postHdr is post that also returns the response headers.
func postHdr(t *testing.T, url, tok string, msg *protobufs.AgentToServer) (int, http.Header, *protobufs.ServerToAgent) {
	t.Helper()
	b, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out protobufs.ServerToAgent
	if resp.StatusCode == http.StatusOK {
		if err := proto.Unmarshal(body, &out); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode, resp.Header, &out
}

func eventsKind(t *testing.T, r *rig, uid, kind string) []store.Event {
	t.Helper()
	var out []store.Event
	for _, e := range eventsOf(t, r, uid) {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

var acceptsSettings = uint64(protobufs.AgentCapabilities_AgentCapabilities_ReportsStatus |
	protobufs.AgentCapabilities_AgentCapabilities_AcceptsOpAMPConnectionSettings)

func description(k, v string) *protobufs.AgentDescription {
	return &protobufs.AgentDescription{IdentifyingAttributes: []*protobufs.KeyValue{{Key: k,
		Value: &protobufs.AnyValue{Value: &protobufs.AnyValue_StringValue{StringValue: v}}}}}
}

// Issue 21, item 1: identity (credentials, duplicates) meets transports
// (WebSocket, plain HTTP). Agent X is online over WebSocket with its own
// credential; someone with the enrollment secret claims its UID over plain
// HTTP. Before, myriarchd issued that caller a new credential for X (X's
// own was refused from then on) and stored its description as X's; a
// copied credential polling over plain HTTP was accepted too.
func TestSecretOverHTTPCannotTakeOverAWebSocketAgent(t *testing.T) {
	st := openStore(t)
	r := newRig(t, st, "r1", "n1")
	defer r.stop(t)
	ctx := context.Background()

	x := startAgent(t, fleettest.AgentOptions{URL: r.ws, Credential: true})
	if !fleettest.Eventually(30*time.Second, func() bool { return x.Credential() != "" }) {
		t.Fatal("X was never offered a credential")
	}
	credX := x.Credential()
	agentIs(t, st, x.UIDString(), func(ag store.Agent) bool {
		return ag.Status == "online" && ag.Identifying["service.name"] == "test-agent"
	})
	if !fleettest.Eventually(30*time.Second, func() bool { return r.srv.liveConn(x.UIDString()) != nil }) {
		t.Fatal("X is not connected with its credential")
	}
	connects := x.Connects()

	// The attacker: the secret, X's UID, plain HTTP, twice (the second
	// poll must not pass as a known plain-HTTP agent either).
	for i := range 2 {
		code, _, resp := postHdr(t, r.url, secret, &protobufs.AgentToServer{InstanceUid: uidBytes(t, x.UIDString()),
			Capabilities: acceptsSettings, AgentDescription: description("service.name", "attacker")})
		if code != http.StatusOK {
			t.Fatalf("poll %d: HTTP %d", i, code)
		}
		if resp.ConnectionSettings != nil {
			t.Fatalf("poll %d: the secret was given a credential: %v", i, resp.ConnectionSettings)
		}
		if nu := resp.GetAgentIdentification().GetNewInstanceUid(); len(nu) != 16 || UID(nu) == x.UIDString() {
			t.Fatalf("poll %d: the duplicate was not told to take a new UID: %v", i, resp.AgentIdentification)
		}
	}
	if uid, ok, err := st.CheckAgentCredential(ctx, credX); err != nil || !ok || uid != x.UIDString() {
		t.Fatalf("X's own credential stopped working: %q %v %v", uid, ok, err)
	}
	if ag, err := st.GetAgent(ctx, x.UIDString()); err != nil || ag.Identifying["service.name"] != "test-agent" {
		t.Fatalf("X's description was overwritten: %+v %v", ag.Identifying, err)
	}
	if x.Connects() != connects || r.srv.liveConn(x.UIDString()) == nil {
		t.Fatal("X lost its connection")
	}
	if evs := eventsKind(t, r, x.UIDString(), store.EventEnrollRefused); len(evs) == 0 || !strings.Contains(evs[0].Detail, "plain HTTP") {
		t.Fatalf("no enrollment_refused event for X: %+v", evs)
	}

	// A copy of X's credential polling over plain HTTP while X is on
	// WebSocket: 409 with Retry-After, nothing stored.
	code, hdr, _ := postHdr(t, r.url, credX, &protobufs.AgentToServer{InstanceUid: uidBytes(t, x.UIDString()),
		AgentDescription: description("service.name", "copy")})
	if code != http.StatusConflict || hdr.Get("Retry-After") == "" {
		t.Fatalf("copied credential over plain HTTP: HTTP %d, Retry-After %q; want 409 with Retry-After", code, hdr.Get("Retry-After"))
	}
	if ag, _ := st.GetAgent(ctx, x.UIDString()); ag.Identifying["service.name"] != "test-agent" {
		t.Fatalf("the copied credential overwrote X: %+v", ag.Identifying)
	}
	// The same at another replica (X's WebSocket is on r1).
	r2 := newRig(t, st, "r2", "n2")
	defer r2.stop(t)
	code, hdr, _ = postHdr(t, r2.url, credX, &protobufs.AgentToServer{InstanceUid: uidBytes(t, x.UIDString()),
		AgentDescription: description("service.name", "copy")})
	if code != http.StatusConflict || hdr.Get("Retry-After") == "" {
		t.Fatalf("copied credential over plain HTTP at another replica: HTTP %d; want 409 with Retry-After", code)
	}
	if ag, _ := st.GetAgent(ctx, x.UIDString()); ag.Identifying["service.name"] != "test-agent" {
		t.Fatalf("the copied credential overwrote X: %+v", ag.Identifying)
	}
	// The secret at another replica: X is online on r1.
	code, _, resp := postHdr(t, r2.url, secret, &protobufs.AgentToServer{InstanceUid: uidBytes(t, x.UIDString()),
		Capabilities: acceptsSettings, AgentDescription: description("service.name", "attacker")})
	if code != http.StatusOK || resp.ConnectionSettings != nil || resp.AgentIdentification == nil {
		t.Fatalf("the secret at another replica: HTTP %d, %v", code, resp)
	}

	// X offline: the secret still cannot enroll its UID ...
	if err := x.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	agentIs(t, st, x.UIDString(), func(ag store.Agent) bool { return ag.Status == "offline" })
	claim := func() *protobufs.ServerToAgent {
		code, _, resp := postHdr(t, r.url, secret, &protobufs.AgentToServer{InstanceUid: uidBytes(t, x.UIDString()),
			Capabilities: acceptsSettings, AgentDescription: description("service.name", "reinstalled")})
		if code != http.StatusOK {
			t.Fatalf("HTTP %d", code)
		}
		return resp
	}
	if resp := claim(); resp.ConnectionSettings != nil || resp.AgentIdentification == nil {
		t.Fatalf("the secret enrolled an offline agent's UID: %v", resp)
	}
	if _, ok, _ := st.CheckAgentCredential(ctx, credX); !ok {
		t.Fatal("X's credential was replaced while X was offline")
	}
	// ... until an admin allows it, once.
	if _, err := st.AllowReenroll(ctx, x.UIDString(), "token:test"); err != nil {
		t.Fatal(err)
	}
	resp = claim()
	if resp.ConnectionSettings == nil || resp.AgentIdentification != nil {
		t.Fatalf("the allowed re-enrollment got no credential: %v", resp)
	}
	if _, ok, _ := st.CheckAgentCredential(ctx, credX); ok {
		t.Fatal("the old credential still works after re-enrollment")
	}
	if c, _, _ := st.AgentCredentialOf(ctx, x.UIDString()); c.ReenrollAllowedAt != nil {
		t.Fatal("the re-enrollment allowance was not used up")
	}
	if evs := eventsKind(t, r, x.UIDString(), store.EventCredentialIssued); len(evs) != 2 || !strings.Contains(evs[0].Detail+evs[1].Detail, "re-enrollment") {
		t.Fatalf("credential_issued events: %+v", evs)
	}
}

// syncBuf is a log sink for a test.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) count(sub string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Count(s.b.String(), sub)
}

// Issue 21, item 3: revocation meets the secret fallback. A revoked agent
// that connects with the secret was upgraded and closed on its first
// message, and the stock opamp-go client reconnected at once, ~925 times
// a second. Now its source is refused before the upgrade (429 with
// Retry-After), which opamp-go honours; a credential from the same source
// still connects; the storm is logged once with a count.
func TestRevokedAgentWithSecretIsRefusedBeforeTheUpgrade(t *testing.T) {
	st := openStore(t)
	var logs syncBuf
	r := newRigWith(t, st, Options{Log: slog.New(slog.NewTextHandler(&logs, nil))})
	defer r.stop(t)
	ctx := context.Background()

	revoked := "0f0f0f0f-0000-4000-8000-0000000000a1"
	if _, err := st.IssueAgentCredential(ctx, revoked); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RevokeAgent(ctx, revoked, "test"); err != nil {
		t.Fatal(err)
	}
	a0 := r.srv.mConnectsValue()
	ag := startAgent(t, fleettest.AgentOptions{URL: r.ws, UID: mustUID(t, revoked)})
	if !fleettest.Eventually(30*time.Second, func() bool { return ag.ConnectFailures() > 0 }) {
		t.Fatal("the revoked agent was never refused before the upgrade")
	}
	time.Sleep(3 * time.Second)
	if n := r.srv.mConnectsValue() - a0; n > 2 {
		t.Fatalf("the revoked agent was upgraded %v times in a few seconds: it reconnects without backoff", n)
	}
	// The same source with the secret: 429 with Retry-After, before the
	// upgrade.
	c, resp, err := websocket.DefaultDialer.Dial(r.ws, http.Header{"Authorization": {"Bearer " + secret}})
	if c != nil {
		c.Close()
	}
	if resp == nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("secret from a source in backoff: %v %v", resp, err)
	}
	// A credential from that source still connects.
	good := "0f0f0f0f-0000-4000-8000-0000000000a2"
	cred, err := st.IssueAgentCredential(ctx, good)
	if err != nil {
		t.Fatal(err)
	}
	c, resp, err = websocket.DefaultDialer.Dial(r.ws, http.Header{"Authorization": {"Bearer " + cred}})
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("a credential from the same source was refused: %v %v", resp, err)
	}
	c.Close()
	if n := logs.count("refused an enrollment with the secret"); n != 1 {
		t.Fatalf("%d log lines for the refused enrollment, want 1 per interval", n)
	}
	if evs := eventsKind(t, r, revoked, store.EventEnrollRefused); len(evs) != 1 {
		t.Fatalf("%d enrollment_refused events, want 1", len(evs))
	}
}

func mustUID(t *testing.T, s string) (u [16]byte) {
	copy(u[:], uidBytes(t, s))
	return u
}

// Issue 21, item 3, second half: a secret holder that reconnects one UID
// in a loop (here: over the UID's reconnect limit) was upgraded ~2,200
// times a second, each with a WARN line. Now the first refusal puts its
// source into backoff.
func TestReconnectStormWithSecretIsRefusedBeforeTheUpgrade(t *testing.T) {
	st := openStore(t)
	var logs syncBuf
	r := newRigWith(t, st, Options{Log: slog.New(slog.NewTextHandler(&logs, nil))})
	defer r.stop(t)
	uid := "0f0f0f0f-0000-4000-8000-0000000000a3"
	for r.srv.reconnects.Allow(uid) {
	}
	a0 := r.srv.mConnectsValue()
	ag := startAgent(t, fleettest.AgentOptions{URL: r.ws, UID: mustUID(t, uid)})
	if !fleettest.Eventually(30*time.Second, func() bool { return ag.ConnectFailures() > 0 }) {
		t.Fatal("the storming agent was never refused before the upgrade")
	}
	time.Sleep(3 * time.Second)
	if n := r.srv.mConnectsValue() - a0; n > 2 {
		t.Fatalf("%v upgrades in a few seconds", n)
	}
	if n := logs.count("level=WARN"); n > 3 {
		t.Fatalf("%d WARN lines: the storm is not logged once per interval", n)
	}
}

// Issue 21, item 4: the secret meets agent reports. A flood of new UIDs
// with the secret was accepted at 238 a second, each with up to 4 MiB of
// description.
func TestEnrollmentRateLimit(t *testing.T) {
	st := openStore(t)
	r := newRigWith(t, st, Options{EnrollmentsPerMinute: 5})
	defer r.stop(t)
	var codes []int
	var refusal string
	for i := range 7 {
		uid := UID([]byte{0x0f, 0, 0, 0, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0xb0, byte(i)})
		code, hdr, resp := postHdr(t, r.url, secret, &protobufs.AgentToServer{InstanceUid: uidBytes(t, uid), AgentDescription: description("service.name", "flood")})
		if resp.ErrorResponse != nil {
			refusal = resp.ErrorResponse.ErrorMessage
			code = -code
		}
		if code == http.StatusTooManyRequests && hdr.Get("Retry-After") == "" {
			t.Fatal("429 without Retry-After")
		}
		codes = append(codes, code)
	}
	want := []int{200, 200, 200, 200, 200, -200, 429}
	for i := range want {
		if codes[i] != want[i] {
			t.Fatalf("answers %v, want %v (negative: an error response)", codes, want)
		}
	}
	if !strings.Contains(refusal, "server.enrollmentsPerMinute (5)") {
		t.Fatalf("the refusal does not name the limit: %q", refusal)
	}
	if got := testutil.ToFloat64(r.srv.mEnroll.WithLabelValues("rate_limited")); got != 1 {
		t.Fatalf("rate_limited counter %v", got)
	}
	var n int
	if err := st.Pool.QueryRow(context.Background(), "SELECT count(*) FROM agents").Scan(&n); err != nil || n != 5 {
		t.Fatalf("%d agents stored, want 5 (%v)", n, err)
	}
}

// Issue 21, item 4: per-field limits on what an agent reports; a report
// beyond one is refused whole, with the setting named, and nothing of it
// is stored.
func TestReportLimits(t *testing.T) {
	st := openStore(t)
	r := newRigWith(t, st, Options{Limits: ReportLimits{MaxAttributes: 3, MaxKeyBytes: 8, MaxValueBytes: 16, MaxEffectiveConfigBytes: 64, MaxHealthComponents: 2}})
	defer r.stop(t)
	kv := func(k, v string) *protobufs.KeyValue {
		return &protobufs.KeyValue{Key: k, Value: &protobufs.AnyValue{Value: &protobufs.AnyValue_StringValue{StringValue: v}}}
	}
	cases := []struct {
		msg  *protobufs.AgentToServer
		want string
	}{
		{&protobufs.AgentToServer{AgentDescription: &protobufs.AgentDescription{IdentifyingAttributes: []*protobufs.KeyValue{kv("a", "1"), kv("b", "2")},
			NonIdentifyingAttributes: []*protobufs.KeyValue{kv("c", "3"), kv("d", "4")}}}, "server.agentMaxAttributes (3)"},
		{&protobufs.AgentToServer{AgentDescription: &protobufs.AgentDescription{IdentifyingAttributes: []*protobufs.KeyValue{kv("much-too-long", "1")}}}, "server.agentMaxAttributeKeyBytes (8)"},
		{&protobufs.AgentToServer{AgentDescription: &protobufs.AgentDescription{IdentifyingAttributes: []*protobufs.KeyValue{kv("k", strings.Repeat("v", 17))}}}, "server.agentMaxAttributeValueBytes (16)"},
		{&protobufs.AgentToServer{EffectiveConfig: &protobufs.EffectiveConfig{ConfigMap: &protobufs.AgentConfigMap{ConfigMap: map[string]*protobufs.AgentConfigFile{
			"": {Body: make([]byte, 65)}}}}}, "server.agentMaxEffectiveConfigBytes (64)"},
		{&protobufs.AgentToServer{Health: &protobufs.ComponentHealth{ComponentHealthMap: map[string]*protobufs.ComponentHealth{
			"p": {ComponentHealthMap: map[string]*protobufs.ComponentHealth{"r": {}, "e": {}}}}}}, "server.agentMaxHealthComponents (2)"},
	}
	for i, c := range cases {
		uid := UID([]byte{0x0f, 0, 0, 0, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0xc0, byte(i)})
		c.msg.InstanceUid = uidBytes(t, uid)
		code, _, resp := postHdr(t, r.url, secret, c.msg)
		if code != http.StatusOK || resp.ErrorResponse == nil || !strings.Contains(resp.ErrorResponse.ErrorMessage, c.want) {
			t.Fatalf("case %d: HTTP %d %v, want a refusal naming %s", i, code, resp.ErrorResponse, c.want)
		}
		if _, err := st.GetAgent(context.Background(), uid); err == nil {
			t.Fatalf("case %d: the refused report was stored", i)
		}
	}
	// Within the limits it is stored.
	uid := "0f0f0f0f-0000-4000-8000-0000000000c9"
	if code, _, resp := postHdr(t, r.url, secret, &protobufs.AgentToServer{InstanceUid: uidBytes(t, uid), AgentDescription: description("k", "v")}); code != 200 || resp.ErrorResponse != nil {
		t.Fatalf("a report within the limits: HTTP %d %v", code, resp.ErrorResponse)
	}
	if testutil.ToFloat64(r.srv.mReports) != float64(len(cases)) {
		t.Fatalf("myriarch_opamp_reports_refused_total %v", testutil.ToFloat64(r.srv.mReports))
	}
}

// Issue 21, item 10: the credential offer meets the agent's heartbeat.
// opamp-go applies the heartbeat interval of the offer, and myriarchd
// offered 30 s to every agent: an agent with a 5 s heartbeat (the bridge's
// opamp.heartbeat_interval) fell silent for 30 s after enrolling. Now it
// keeps its own: its last-seen time moves every ~5 s after the credential.
func TestAgentKeepsItsOwnHeartbeatIntervalAfterTheCredentialOffer(t *testing.T) {
	st := openStore(t)
	r := newRig(t, st, "r1", "n1")
	defer r.stop(t)
	ctx := context.Background()
	a := startAgent(t, fleettest.AgentOptions{URL: r.ws, Credential: true, Heartbeat: 5 * time.Second})
	if !fleettest.Eventually(60*time.Second, func() bool { return a.Credential() != "" }) {
		t.Fatal("no credential offered")
	}
	var seen []time.Time
	deadline := time.Now().Add(24 * time.Second)
	for time.Now().Before(deadline) && len(seen) < 4 {
		if err := r.b.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		ag, err := st.GetAgent(ctx, a.UIDString())
		if err != nil {
			t.Fatal(err)
		}
		if len(seen) == 0 || ag.LastSeen.After(seen[len(seen)-1]) {
			seen = append(seen, ag.LastSeen)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("last_seen after the credential: %v", seen)
	if len(seen) < 4 {
		t.Fatalf("last_seen moved %d times in 24 s after the credential offer; a 5 s heartbeat moves it about 4 times", len(seen)-1)
	}
}

// With server.opampHeartbeatInterval set, that interval is offered; unset,
// a WebSocket agent that reports heartbeats is offered what it showed and
// a plain-HTTP agent 0 (which opamp-go ignores there).
func TestOfferedHeartbeatInterval(t *testing.T) {
	hbCap := uint64(protobufs.AgentCapabilities_AgentCapabilities_ReportsHeartbeat)
	s := &Server{}
	if got := s.offer("c", "e", hbCap, true, 5).Opamp.HeartbeatIntervalSeconds; got != 5 {
		t.Fatalf("learnt 5 s: offered %d", got)
	}
	if got := s.offer("c", "e", hbCap, false, 0).Opamp.HeartbeatIntervalSeconds; got != 0 {
		t.Fatalf("plain HTTP, unset: offered %d", got)
	}
	s.o.HeartbeatInterval = 7 * time.Second
	if got := s.offer("c", "e", hbCap, true, 5).Opamp.HeartbeatIntervalSeconds; got != 7 {
		t.Fatalf("configured 7 s: offered %d", got)
	}
	if got := heartbeatSeconds(time.Unix(100, 0), time.Unix(105, 2e8)); got != 5 {
		t.Fatalf("heartbeatSeconds %d", got)
	}
	if !isHeartbeat(&protobufs.AgentToServer{InstanceUid: []byte{1}, SequenceNum: 3, Capabilities: 5}) ||
		isHeartbeat(&protobufs.AgentToServer{InstanceUid: []byte{1}, Health: &protobufs.ComponentHealth{}}) {
		t.Fatal("isHeartbeat")
	}
}

// An agent that talks more often than its heartbeat interval sends no
// heartbeat to learn the interval from; its credential still comes, after
// LearnHeartbeatWithin, with the longest gap seen between its messages
// (before: never, the agent stayed on the enrollment secret).
func TestCredentialOfferedToAnAgentThatNeverHeartbeats(t *testing.T) {
	st := openStore(t)
	r := newRigWith(t, st, Options{LearnHeartbeatWithin: time.Second})
	defer r.stop(t)
	a := startAgent(t, fleettest.AgentOptions{URL: r.ws, Credential: true, Heartbeat: time.Hour})
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
				_ = a.Client.SetHealth(&protobufs.ComponentHealth{Healthy: true, Status: strconv.Itoa(i)})
			}
		}
	}()
	ok := fleettest.Eventually(60*time.Second, func() bool { return a.Credential() != "" })
	close(stop)
	<-done
	if !ok {
		t.Fatal("an agent that never sends a bare heartbeat was never offered a credential")
	}
}
