package opampserver

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
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

// post sends one AgentToServer over plain HTTP with bearer tok.
func post(t *testing.T, url, tok string, msg *protobufs.AgentToServer, gz bool) (int, *protobufs.ServerToAgent) {
	t.Helper()
	b, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	return postRaw(t, url, tok, b, gz)
}

func postRaw(t *testing.T, url, tok string, b []byte, gz bool) (int, *protobufs.ServerToAgent) {
	t.Helper()
	if gz {
		var buf bytes.Buffer
		w := gzip.NewWriter(&buf)
		w.Write(b)
		w.Close()
		b = buf.Bytes()
	}
	req, _ := http.NewRequest("POST", url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Authorization", "Bearer "+tok)
	if gz {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out protobufs.ServerToAgent
	if resp.StatusCode == http.StatusOK {
		if resp.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			body, _ = io.ReadAll(zr)
		}
		if err := proto.Unmarshal(body, &out); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode, &out
}

func uidBytes(t *testing.T, s string) []byte {
	b, err := ParseUID(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAgentCredentialIsBoundToItsUID(t *testing.T) {
	st := openStore(t)
	r := newRig(t, st, "r1", "n1")
	defer r.stop(t)
	ctx := context.Background()

	a := startAgent(t, fleettest.AgentOptions{URL: r.ws, Credential: true})
	if !fleettest.Eventually(30*time.Second, func() bool { return a.Credential() != "" }) {
		t.Fatal("the enrolling agent was never offered a credential")
	}
	cred := a.Credential()
	if !strings.HasPrefix(cred, store.CredentialPrefix) {
		t.Fatalf("credential %q", cred)
	}
	c, ok, err := st.AgentCredentialOf(ctx, a.UIDString())
	if err != nil || !ok || !c.Issued {
		t.Fatalf("credential not stored: %+v %v %v", c, ok, err)
	}
	var stored []byte
	if err := st.Pool.QueryRow(ctx, "SELECT hash FROM agent_credentials WHERE instance_uid = $1", a.UIDString()).Scan(&stored); err != nil ||
		bytes.Contains(stored, []byte(cred)) || len(stored) != 32 {
		t.Fatalf("the credential must be stored as a SHA-256 hash: %x %v", stored, err)
	}

	// The credential speaks for its own UID (over plain HTTP only while
	// the agent is not connected over WebSocket: a second transport for
	// one UID is refused, see TestSecretOverHTTPCannotTakeOverAWebSocketAgent) ...
	caps := uint64(protobufs.AgentCapabilities_AgentCapabilities_ReportsStatus)
	code, _ := post(t, r.url, cred, &protobufs.AgentToServer{InstanceUid: uidBytes(t, a.UIDString()), Capabilities: caps}, false)
	if code != http.StatusConflict {
		t.Fatalf("own UID with own credential while connected over WebSocket: HTTP %d, want 409", code)
	}
	// ... and not for another one.
	other := "0f0f0f0f-0000-4000-8000-000000000001"
	code, resp := post(t, r.url, cred, &protobufs.AgentToServer{InstanceUid: uidBytes(t, other), Capabilities: caps,
		AgentDescription: &protobufs.AgentDescription{}}, false)
	if code == http.StatusOK && resp.ErrorResponse == nil {
		t.Fatalf("a credential spoke for another UID: HTTP %d %v", code, resp)
	}
	if _, err := st.GetAgent(ctx, other); err == nil {
		t.Fatal("the other UID was stored")
	}
	// An unknown credential and a wrong secret are refused.
	for _, tok := range []string{store.CredentialPrefix + "nope", "wrong-secret"} {
		if code, _ := post(t, r.url, tok, &protobufs.AgentToServer{InstanceUid: uidBytes(t, a.UIDString())}, false); code != http.StatusUnauthorized {
			t.Fatalf("token %q: HTTP %d", tok, code)
		}
	}

	// Rotation: a new credential reaches the agent; the old one stops working.
	if err := st.RequestCredentialRotation(ctx, a.UIDString()); err != nil {
		t.Fatal(err)
	}
	r.srv.Push(ctx, store.RotateNotifyPrefix+a.UIDString())
	if !fleettest.Eventually(30*time.Second, func() bool { return a.Credential() != cred }) {
		t.Fatal("rotation never reached the agent")
	}
	if code, _ := post(t, r.url, cred, &protobufs.AgentToServer{InstanceUid: uidBytes(t, a.UIDString())}, false); code != http.StatusUnauthorized {
		t.Fatalf("old credential after rotation: HTTP %d", code)
	}

	// Revocation closes the connection; the agent can neither reconnect
	// with its credential nor enroll again with the secret.
	if _, err := st.RevokeAgent(ctx, a.UIDString(), "test"); err != nil {
		t.Fatal(err)
	}
	connects := a.Connects()
	r.srv.Push(ctx, store.RevokeNotifyPrefix+a.UIDString())
	if !fleettest.Eventually(30*time.Second, func() bool { return r.srv.Connections() == 0 }) {
		t.Fatal("the revoked agent stayed connected")
	}
	if !fleettest.Eventually(30*time.Second, func() bool { return a.ConnectFailures() > 0 }) {
		t.Fatal("the revoked agent's reconnect was not refused")
	}
	if a.Connects() != connects {
		t.Fatalf("the revoked agent connected again: %d → %d", connects, a.Connects())
	}
	code, resp = post(t, r.url, secret, &protobufs.AgentToServer{InstanceUid: uidBytes(t, a.UIDString()), AgentDescription: &protobufs.AgentDescription{}}, false)
	if code == http.StatusOK && resp.ErrorResponse == nil {
		t.Fatal("a revoked agent enrolled again with the secret")
	}
}

// cpuTime is this process's user+system CPU time.
func cpuTime(t *testing.T) time.Duration {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skip("no /proc")
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond // USER_HZ 100
}

// TestDuplicateUIDsDoNotStorm runs two real opamp-go clients with one
// instance UID, twice: a clone that enrolls with the secret (it is told to
// take a new UID) and a clone that copied the credential too (refused
// before the upgrade, with Retry-After). Before this change the two
// kicked each other off ~700 times a second.
func TestDuplicateUIDsDoNotStorm(t *testing.T) {
	st := openStore(t)
	r := newRig(t, st, "r1", "n1")
	defer r.stop(t)

	a := startAgent(t, fleettest.AgentOptions{URL: r.ws, Credential: true})
	if !fleettest.Eventually(30*time.Second, func() bool { return a.Credential() != "" }) {
		t.Fatal("no credential")
	}
	agentIs(t, st, a.UIDString(), func(ag store.Agent) bool { return ag.Status == "online" })

	// A clone enrolling with the secret gets a UID of its own.
	clone := startAgent(t, fleettest.AgentOptions{URL: r.ws, Credential: true, UID: a.UID})
	if !fleettest.Eventually(30*time.Second, func() bool { return clone.CurrentUID() != a.UIDString() }) {
		t.Fatal("the clone was not given a new UID")
	}
	agentIs(t, st, clone.CurrentUID(), func(ag store.Agent) bool { return ag.Status == "online" })

	// A clone that copied the credential is refused while the original
	// is connected.
	cpu0, conns0 := cpuTime(t), r.srv.mConnectsValue()
	copyCat, err := fleettest.StartAgent(context.Background(), fleettest.AgentOptions{URL: r.ws, Secret: a.Credential(), UID: a.UID})
	if err != nil {
		t.Fatal(err)
	}
	defer copyCat.Stop(context.Background())
	const window = 5 * time.Second
	time.Sleep(window)
	cpu1, conns1 := cpuTime(t), r.srv.mConnectsValue()
	reconnects := conns1 - conns0
	t.Logf("duplicate UID with a copied credential over %v: %.1f accepted connections/s, %d refused attempts, CPU %.1f%% of a core (server and clients)",
		window, reconnects/window.Seconds(), copyCat.ConnectFailures()/2, 100*float64(cpu1-cpu0)/float64(window))
	if reconnects > 0 || copyCat.Connects() != 0 {
		t.Fatalf("the copied credential connected: %v connections, %d connects", reconnects, copyCat.Connects())
	}
	if a.Connects() != 1 || clone.Connects() != 1 {
		t.Fatalf("the original or the clone was kicked off: %d %d connects", a.Connects(), clone.Connects())
	}
	// opamp-go counts OnConnectFailed twice per attempt; with Retry-After
	// the attempts are a few (a loaded machine makes it up to about 6),
	// not the hundreds per second of a storm.
	if f := copyCat.ConnectFailures() / 2; f > 15 {
		t.Fatalf("%d refused attempts in %v: the client does not back off", f, window)
	}
}

func (s *Server) mConnectsValue() float64 { return testutil.ToFloat64(s.mConnects) }

func TestOpAMPMessageLimitAfterDecompression(t *testing.T) {
	st := openStore(t)
	b := lastseen.New(st, time.Hour, nil, nil)
	srv := New(Options{Store: st, Batcher: b, ReplicaID: "r2", Nonce: "n2", Secret: secret, MaxMessageBytes: 64 << 10})
	if err := srv.Start("127.0.0.1:0", "/v1/opamp", nil); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(context.Background())
	url := "http://" + srv.Addr().String() + "/v1/opamp"
	uid := "0f0f0f0f-0000-4000-8000-000000000002"
	// A gzip bomb: 8 MiB of zeros in a few kilobytes.
	msg := &protobufs.AgentToServer{InstanceUid: uidBytes(t, uid), EffectiveConfig: &protobufs.EffectiveConfig{ConfigMap: &protobufs.AgentConfigMap{
		ConfigMap: map[string]*protobufs.AgentConfigFile{"": {Body: make([]byte, 8<<20)}}}}}
	code, _ := post(t, url, secret, msg, true)
	if code != http.StatusRequestEntityTooLarge {
		t.Fatalf("gzip bomb: HTTP %d, want 413", code)
	}
	if _, err := st.GetAgent(context.Background(), uid); err == nil {
		t.Fatal("the oversized message was processed")
	}
	// A message within the limit still works, compressed or not.
	msg.EffectiveConfig = nil
	for _, gz := range []bool{false, true} {
		if code, _ := post(t, url, secret, msg, gz); code != http.StatusOK {
			t.Fatalf("small message (gzip %v): HTTP %d", gz, code)
		}
	}
	// WebSocket: a message over the read limit closes the connection.
	ag := startAgent(t, fleettest.AgentOptions{URL: "ws://" + srv.Addr().String() + "/v1/opamp"})
	if !fleettest.Eventually(30*time.Second, func() bool { return srv.Connections() == 1 }) {
		t.Fatal("agent never connected")
	}
	before := ag.Connects()
	big := strings.Repeat("x", 128<<10)
	if err := ag.Client.SetAgentDescription(&protobufs.AgentDescription{IdentifyingAttributes: []*protobufs.KeyValue{{Key: "big",
		Value: &protobufs.AnyValue{Value: &protobufs.AnyValue_StringValue{StringValue: big}}}}}); err != nil {
		t.Fatal(err)
	}
	if !fleettest.Eventually(30*time.Second, func() bool { return ag.Connects() > before }) {
		t.Fatal("an oversized WebSocket message did not close the connection")
	}
	a, err := st.GetAgent(context.Background(), ag.UIDString())
	if err != nil || a.Identifying["big"] != "" {
		t.Fatalf("the oversized description was stored: %v", err)
	}
}

func TestReconnectLimitPerUID(t *testing.T) {
	st := openStore(t)
	srv := New(Options{Store: st, Batcher: lastseen.New(st, time.Hour, nil, nil), ReplicaID: "r1", Nonce: "n1", Secret: secret, ReconnectsPerMinute: 3})
	if err := srv.Start("127.0.0.1:0", "/v1/opamp", nil); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(context.Background())
	uid := "0f0f0f0f-0000-4000-8000-000000000003"
	cred, err := st.IssueAgentCredential(context.Background(), uid)
	if err != nil {
		t.Fatal(err)
	}
	var codes []int
	for range 5 {
		c, resp, err := websocket.DefaultDialer.Dial("ws://"+srv.Addr().String()+"/v1/opamp", http.Header{"Authorization": {"Bearer " + cred}})
		if c != nil {
			c.Close()
			// Wait until the server saw the close, so that the next dial is
			// no duplicate of this one.
			fleettest.Eventually(10*time.Second, func() bool { return srv.Connections() == 0 })
		}
		if resp == nil {
			t.Fatal(err)
		}
		codes = append(codes, resp.StatusCode)
		if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
			t.Fatal("429 without Retry-After")
		}
	}
	want := []int{101, 101, 101, 429, 429}
	if fmt.Sprint(codes) != fmt.Sprint(want) {
		t.Fatalf("upgrade answers %v, want %v", codes, want)
	}
}

// A revocation and a rotation whose notifications were lost are applied by
// the reconcile.
func TestReconcileAppliesLostRevocationsAndRotations(t *testing.T) {
	st := openStore(t)
	r := newRig(t, st, "r1", "n1")
	defer r.stop(t)
	ctx := context.Background()
	a := startAgent(t, fleettest.AgentOptions{URL: r.ws, Credential: true})
	b := startAgent(t, fleettest.AgentOptions{URL: r.ws, Credential: true})
	if !fleettest.Eventually(30*time.Second, func() bool { return a.Credential() != "" && b.Credential() != "" && r.srv.Connections() == 2 }) {
		t.Fatal("agents never enrolled")
	}
	credB := b.Credential()
	if _, err := st.RevokeAgent(ctx, a.UIDString(), "test"); err != nil {
		t.Fatal(err)
	}
	if err := st.RequestCredentialRotation(ctx, b.UIDString()); err != nil {
		t.Fatal(err)
	}
	// No Push: the notifications are lost.
	if err := r.srv.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if !fleettest.Eventually(30*time.Second, func() bool { return r.srv.Connections() == 1 && b.Credential() != credB }) {
		t.Fatalf("after the reconcile: %d connections, rotated %v", r.srv.Connections(), b.Credential() != credB)
	}
	if p, _ := st.PendingRotations(ctx, []string{b.UIDString()}); len(p) != 0 {
		t.Fatal("the rotation request stays pending after the new credential was issued")
	}
}

// A plain-HTTP agent enrolls like a WebSocket one and then polls with its
// credential.
func TestPlainHTTPAgentGetsAndUsesItsCredential(t *testing.T) {
	st := openStore(t)
	r := newRig(t, st, "r1", "n1")
	defer r.stop(t)
	a := startAgent(t, fleettest.AgentOptions{URL: r.url, HTTP: true, Heartbeat: 100 * time.Millisecond, Credential: true})
	if !fleettest.Eventually(30*time.Second, func() bool { return a.Credential() != "" }) {
		t.Fatal("no credential offered over plain HTTP")
	}
	// Polls with the credential keep the agent's state current.
	agentIs(t, st, a.UIDString(), func(ag store.Agent) bool { return ag.Status == "online" })
	byCred := func() float64 { return testutil.ToFloat64(r.srv.mAuth.WithLabelValues("credential")) }
	if !fleettest.Eventually(30*time.Second, func() bool { return byCred() > 3 }) {
		t.Fatalf("the agent does not poll with its credential: %v polls", byCred())
	}
	if got := testutil.ToFloat64(r.srv.mRejected); got != 0 {
		t.Fatalf("%v polls refused", got)
	}
}

// A revoked plain-HTTP agent is offline at once (it has no connection
// whose close would say so), and the last-seen flush of its polls from
// before the revocation does not mark it online again; its later polls
// are refused. It used to stay "online" until the offline sweep.
func TestRevokedPlainHTTPAgentIsOfflineAtOnce(t *testing.T) {
	st := openStore(t)
	r := newRig(t, st, "r1", "n1")
	defer r.stop(t)
	a := startAgent(t, fleettest.AgentOptions{URL: r.url, HTTP: true, Heartbeat: 100 * time.Millisecond, Credential: true})
	ctx := context.Background()
	if !fleettest.Eventually(30*time.Second, func() bool { return a.Credential() != "" }) {
		t.Fatal("no credential offered over plain HTTP")
	}
	agentIs(t, st, a.UIDString(), func(ag store.Agent) bool { return ag.Status == "online" })
	if seen, _ := r.b.Pending(); seen == 0 {
		t.Fatal("no poll waiting for the last-seen flush: the test would not show that one cannot undo the revocation")
	}
	if _, err := st.RevokeAgent(ctx, a.UIDString(), "test"); err != nil {
		t.Fatal(err)
	}
	ag, err := st.GetAgent(ctx, a.UIDString())
	if err != nil || ag.Status != "offline" {
		t.Fatalf("right after the revocation: status %q (%v), want offline", ag.Status, err)
	}
	r.srv.Push(ctx, store.RevokeNotifyPrefix+a.UIDString())
	refused := testutil.ToFloat64(r.srv.mRejected)
	if !fleettest.Eventually(30*time.Second, func() bool { return testutil.ToFloat64(r.srv.mRejected) > refused+2 }) {
		t.Fatal("the revoked agent's polls are not refused")
	}
	if err := r.b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if ag, err := st.GetAgent(ctx, a.UIDString()); err != nil || ag.Status != "offline" {
		t.Fatalf("after the last-seen flush: status %q (%v), want offline", ag.Status, err)
	}
	evs, err := st.Events(ctx, a.UIDString(), 50)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range evs {
		found = found || (e.Kind == store.EventMarkedOffline && e.Detail == "credential revoked")
	}
	if !found {
		t.Errorf("no marked_offline event for the revocation: %+v", evs)
	}
}
