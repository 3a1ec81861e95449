package opampserver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"
	"google.golang.org/protobuf/proto"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/lastseen"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// TestMeasureDuplicateUIDStorm is a measurement, not a check: two real
// opamp-go clients with one instance UID and the enrollment secret, for
// MYRIARCH_MEASURE_SECONDS (default 10). It prints the accepted
// connections per second and the CPU of this process (server and both
// clients). Run it with MYRIARCH_MEASURE=1:
//
//	MYRIARCH_MEASURE=1 go test -run TestMeasureDuplicateUIDStorm -v ./internal/fleet/opampserver/
func TestMeasureDuplicateUIDStorm(t *testing.T) {
	if os.Getenv("MYRIARCH_MEASURE") == "" {
		t.Skip("a measurement; set MYRIARCH_MEASURE=1")
	}
	window := 10 * time.Second
	if d, err := time.ParseDuration(os.Getenv("MYRIARCH_MEASURE_SECONDS") + "s"); err == nil && d > 0 {
		window = d
	}
	st := openStore(t)
	r := newRig(t, st, "r1", "n1")
	defer r.stop(t)
	a := startAgent(t, fleettest.AgentOptions{URL: r.ws})
	if !fleettest.Eventually(30*time.Second, func() bool { return r.srv.Connections() == 1 }) {
		t.Fatal("first agent never connected")
	}
	b := startAgent(t, fleettest.AgentOptions{URL: r.ws, UID: a.UID})
	time.Sleep(time.Second)
	c0, cpu0 := testutil.ToFloat64(r.srv.mConnects), cpuTime(t)
	time.Sleep(window)
	c1, cpu1 := testutil.ToFloat64(r.srv.mConnects), cpuTime(t)
	t.Logf("MEASURE duplicate UID, two opamp-go clients, %v: %.1f accepted connections/s, CPU %.1f%% of a core (server + clients); agent connects %d and %d",
		window, (c1-c0)/window.Seconds(), 100*float64(cpu1-cpu0)/float64(window), a.Connects(), b.Connects())
}

// measureWindow is MYRIARCH_MEASURE_SECONDS (default 10 s).
func measureWindow() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("MYRIARCH_MEASURE_SECONDS") + "s"); err == nil && d > 0 {
		return d
	}
	return 10 * time.Second
}

// lineCounter counts the log lines and bytes written to it.
type lineCounter struct {
	mu           sync.Mutex
	lines, bytes int
}

func (c *lineCounter) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.lines += bytes.Count(p, []byte("\n"))
	c.bytes += len(p)
	c.mu.Unlock()
	return len(p), nil
}

func (c *lineCounter) get() (int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lines, c.bytes
}

// measureStorm runs one stock opamp-go WebSocket client with the
// enrollment secret and UID uid for the window and prints the accepted
// upgrades, the log lines and the CPU of this process.
func measureStorm(t *testing.T, name string, prepare func(st *store.Store, srv *Server, uid string)) {
	window := measureWindow()
	st := openStore(t)
	var logs lineCounter
	srv := New(Options{Store: st, Batcher: lastseen.New(st, time.Hour, nil, nil), ReplicaID: "r1", Nonce: "n1", Secret: secret,
		Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err := srv.Start("127.0.0.1:0", "/v1/opamp", nil); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(context.Background())
	uid := "0f0f0f0f-0000-4000-8000-0000000000f1"
	prepare(st, srv, uid)
	var u [16]byte
	copy(u[:], uidBytes(t, uid))
	c0, cpu0 := testutil.ToFloat64(srv.mConnects), cpuTime(t)
	l0, b0 := logs.get()
	a := startAgent(t, fleettest.AgentOptions{URL: "ws://" + srv.Addr().String() + "/v1/opamp", UID: u})
	time.Sleep(window)
	c1, cpu1 := testutil.ToFloat64(srv.mConnects), cpuTime(t)
	l1, b1 := logs.get()
	_ = a.Stop(context.Background())
	t.Logf("MEASURE %s, one stock opamp-go client, %v: %.0f upgrades (%.1f/s), %d log lines (%d bytes), CPU %.1f%% of a core (server + client), %d refused attempts",
		name, window, c1-c0, (c1-c0)/window.Seconds(), l1-l0, b1-b0, 100*float64(cpu1-cpu0)/float64(window), a.ConnectFailures()/2)
}

// TestMeasureRevokedAgentWithSecret (issue 21, item 3): a revoked agent
// that falls back to the secret.
//
//	MYRIARCH_MEASURE=1 go test -run 'TestMeasure(RevokedAgentWithSecret|SecretStorm|EnrollmentFlood)' -v ./internal/fleet/opampserver/
func TestMeasureRevokedAgentWithSecret(t *testing.T) {
	if os.Getenv("MYRIARCH_MEASURE") == "" {
		t.Skip("a measurement; set MYRIARCH_MEASURE=1")
	}
	measureStorm(t, "revoked agent with the secret", func(st *store.Store, _ *Server, uid string) {
		ctx := context.Background()
		if _, err := st.IssueAgentCredential(ctx, uid); err != nil {
			t.Fatal(err)
		}
		if _, err := st.RevokeAgent(ctx, uid, "measure"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestMeasureSecretStorm (issue 21, item 3): a secret holder that
// reconnects one UID past its reconnect limit.
func TestMeasureSecretStorm(t *testing.T) {
	if os.Getenv("MYRIARCH_MEASURE") == "" {
		t.Skip("a measurement; set MYRIARCH_MEASURE=1")
	}
	measureStorm(t, "secret holder over the UID's reconnect limit", func(_ *store.Store, srv *Server, uid string) {
		for srv.reconnects.Allow(uid) {
		}
	})
}

// TestMeasureEnrollmentFlood (issue 21, item 4): four senders post new
// UIDs with the secret and a 64 KiB description over plain HTTP for the
// window; it prints the enrollments accepted per second.
func TestMeasureEnrollmentFlood(t *testing.T) {
	if os.Getenv("MYRIARCH_MEASURE") == "" {
		t.Skip("a measurement; set MYRIARCH_MEASURE=1")
	}
	window := measureWindow()
	st := openStore(t)
	srv := New(Options{Store: st, Batcher: lastseen.New(st, time.Hour, nil, nil), ReplicaID: "r1", Nonce: "n1", Secret: secret})
	if err := srv.Start("127.0.0.1:0", "/v1/opamp", nil); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(context.Background())
	url := "http://" + srv.Addr().String() + "/v1/opamp"
	var attrs []*protobufs.KeyValue
	for i := range 16 {
		attrs = append(attrs, &protobufs.KeyValue{Key: fmt.Sprintf("k%d", i), Value: &protobufs.AnyValue{Value: &protobufs.AnyValue_StringValue{StringValue: strings.Repeat("x", 4096)}}})
	}
	var sent, ok200 atomic.Int64
	deadline := time.Now().Add(window)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				u := make([]byte, 16)
				u[0], u[1], u[2], u[3] = byte(w), byte(i>>16), byte(i>>8), byte(i)
				b, _ := proto.Marshal(&protobufs.AgentToServer{InstanceUid: u, AgentDescription: &protobufs.AgentDescription{NonIdentifyingAttributes: attrs}})
				req, _ := http.NewRequest("POST", url, bytes.NewReader(b))
				req.Header.Set("Content-Type", "application/x-protobuf")
				req.Header.Set("Authorization", "Bearer "+secret)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				sent.Add(1)
				if resp.StatusCode == 200 {
					ok200.Add(1)
				}
			}
		})
	}
	wg.Wait()
	var n int
	if err := st.Pool.QueryRow(context.Background(), "SELECT count(*) FROM agents").Scan(&n); err != nil {
		t.Fatal(err)
	}
	t.Logf("MEASURE enrollment flood, 4 senders, 64 KiB descriptions, %v: %d requests, %d answered 200, %d agents stored (%.1f enrollments/s accepted)",
		window, sent.Load(), ok200.Load(), n, float64(n)/window.Seconds())
}
