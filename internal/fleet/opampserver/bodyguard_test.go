package opampserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"
	"github.com/pires/go-proxyproto"

	"github.com/myriarch/myriarch/internal/fleet/authlimit"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/lastseen"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// guarded starts a server without a database (the secret needs none)
// with limits l.
func guarded(t *testing.T, st *store.Store, o Options) *Server {
	t.Helper()
	o.Batcher = lastseen.New(st, time.Hour, nil, nil)
	o.Store, o.ReplicaID, o.Nonce, o.Secret = st, "r", "n", secret
	s := New(o)
	if err := s.Start("127.0.0.1:0", "/v1/opamp", nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s.Stop(ctx)
	})
	return s
}

// rawPost opens a connection and sends the headers of a POST declaring
// contentLength bytes of body; the body is the caller's to send.
func rawPost(t *testing.T, addr string, contentLength int, header ...string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := fmt.Sprintf("POST /v1/opamp HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: %d\r\n", contentLength)
	for _, l := range header {
		h += l + "\r\n"
	}
	if _, err := io.WriteString(c, h+"\r\n"); err != nil {
		t.Fatal(err)
	}
	return c
}

// status reads the status code of the response on c, waiting at most
// within (generous: a test fails, it does not measure), and whether the
// server closed the connection after it.
func status(t *testing.T, c net.Conn, within time.Duration) (code int, closed bool) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(within))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no response within %v: %v", within, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// Closed: EOF, or a reset when unread bytes of ours were left in the
	// server's buffer; not a timeout of our read.
	_, err = br.ReadByte()
	var ne net.Error
	return resp.StatusCode, err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// trickle sends one byte every interval until stop is closed or the
// connection fails.
func trickle(c net.Conn, interval time.Duration, stop <-chan struct{}) {
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if _, err := c.Write([]byte{0}); err != nil {
					return
				}
			}
		}
	}()
}

// TestUnauthenticatedBodyIsNotRead: requests without or with a wrong
// Authorization that declare a 4 MiB body and trickle it (or send none)
// are answered 401 at once and closed, without a byte charged. The old
// limit read the whole body before opamp-go authenticated: no answer
// until 4 MiB had arrived.
func TestUnauthenticatedBodyIsNotRead(t *testing.T) {
	s := guarded(t, nil, Options{})
	stop := make(chan struct{})
	defer close(stop)
	var conns []net.Conn
	for i := range 30 {
		var hdr []string
		switch i % 3 {
		case 1:
			hdr = []string{"Authorization: Bearer wrong-secret"}
		case 2:
			hdr = []string{"Authorization: Bearer myr_not-an-agent-token"}
		}
		c := rawPost(t, s.Addr().String(), 4<<20, hdr...)
		if i%2 == 0 {
			trickle(c, 50*time.Millisecond, stop)
		}
		conns = append(conns, c)
	}
	for i, c := range conns {
		code, closed := status(t, c, 20*time.Second)
		if code != http.StatusUnauthorized && code != http.StatusTooManyRequests || !closed {
			t.Fatalf("conn %d: HTTP %d, closed %v; want 401 (or 429 past the failure limit) and closed", i, code, closed)
		}
	}
	if total, _ := s.guard.inFlight("127.0.0.1"); total != 0 {
		t.Fatalf("%d body bytes charged for unauthenticated requests", total)
	}
	// A WebSocket upgrade without a credential is refused before the
	// upgrade as well.
	resp, err := http.DefaultClient.Do(func() *http.Request {
		r, _ := http.NewRequest("GET", "http://"+s.Addr().String()+"/v1/opamp", nil)
		r.Header.Set("Connection", "Upgrade")
		r.Header.Set("Upgrade", "websocket")
		r.Header.Set("Sec-WebSocket-Version", "13")
		r.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		return r
	}())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		t.Fatal("an unauthenticated WebSocket upgrade was accepted")
	}
}

// TestAuthenticatedSlowBodyIsCut: an authenticated body that trickles,
// or never comes, is cut with 408 by the minimum rate / the deadline, and
// its bytes are given back. The old limit had no deadline: it waited for
// as long as the client liked.
func TestAuthenticatedSlowBodyIsCut(t *testing.T) {
	s := guarded(t, nil, Options{Listener: ListenerLimits{BodyTimeout: 4 * time.Second, BodyMinRate: 1000}})
	stop := make(chan struct{})
	defer close(stop)
	slow := rawPost(t, s.Addr().String(), 1<<20, "Authorization: Bearer "+secret)
	trickle(slow, 20*time.Millisecond, stop) // 50 B/s < 1000 B/s
	silent := rawPost(t, s.Addr().String(), 1<<20, "Authorization: Bearer "+secret)
	// Fast enough for the rate, too long for the deadline: 2,000 B/s.
	steady := rawPost(t, s.Addr().String(), 1<<20, "Authorization: Bearer "+secret)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
				if _, err := steady.Write(make([]byte, 200)); err != nil {
					return
				}
			}
		}
	}()
	for name, c := range map[string]net.Conn{"trickle": slow, "headers only": silent, "steady but long": steady} {
		if code, closed := status(t, c, 30*time.Second); code != http.StatusRequestTimeout || !closed {
			t.Fatalf("%s: HTTP %d, closed %v; want 408 and closed", name, code, closed)
		}
	}
	if !fleettest.Eventually(10*time.Second, func() bool { total, _ := s.guard.inFlight("127.0.0.1"); return total == 0 }) {
		t.Fatal("the bytes of cut bodies were not given back")
	}
	// A body at a normal pace still arrives (a poll with the secret).
	if code, _ := post(t, "http://"+s.Addr().String()+"/v1/opamp", secret, &protobufs.AgentToServer{}, true); code != http.StatusOK && code != http.StatusBadRequest {
		t.Fatalf("a normal poll: HTTP %d", code)
	}
}

// TestBodyBytesInFlightAreBounded: bodies that stall halfway hold their
// bytes; per source and per listener the budget refuses the next one
// (429 / 503 with Retry-After) before it is read. Sources are told apart
// by X-Forwarded-For from a trusted proxy (the test's own address).
func TestBodyBytesInFlightAreBounded(t *testing.T) {
	const kib = 1 << 10
	s := guarded(t, nil, Options{MaxMessageBytes: 128 * kib, Listener: ListenerLimits{Proxies: mustProxies(t, "127.0.0.1"),
		BodyBytesPerSource: 256 * kib, BodyBytesInFlight: 512 * kib, BodyMinRate: -1, BodyTimeout: 5 * time.Minute}})
	addr := s.Addr().String()
	// hold sends 90 KiB of a 100 KiB body from src and stops.
	hold := func(src string) net.Conn {
		c := rawPost(t, addr, 100*kib, "Authorization: Bearer "+secret, "X-Forwarded-For: "+src)
		c.Write(make([]byte, 90*kib))
		return c
	}
	charged := func(src string, want int64) {
		t.Helper()
		var total, per int64
		if !fleettest.Eventually(10*time.Second, func() bool { total, per = s.guard.inFlight(src); return per >= want }) {
			t.Fatalf("source %s: %d bytes charged, want %d", src, per, want)
		}
		if total > 512*kib || per > 256*kib {
			t.Fatalf("over budget: listener %d, source %s %d", total, src, per)
		}
	}
	hold("192.0.2.1")
	hold("192.0.2.1")
	charged("192.0.2.1", 200*kib)
	if code, closed := status(t, hold("192.0.2.1"), 20*time.Second); code != http.StatusTooManyRequests || !closed {
		t.Fatalf("third body of one source: HTTP %d, closed %v; want 429", code, closed)
	}
	hold("192.0.2.2")
	hold("192.0.2.2")
	charged("192.0.2.2", 200*kib)
	hold("192.0.2.3")
	// 500 KiB are charged; the next 100 KiB would pass 512 KiB.
	if !fleettest.Eventually(10*time.Second, func() bool { total, _ := s.guard.inFlight(""); return total >= 500*kib }) {
		t.Fatal("the fifth body was never charged")
	}
	if code, closed := status(t, hold("192.0.2.4"), 20*time.Second); code != http.StatusServiceUnavailable || !closed {
		t.Fatalf("a body past the listener budget: HTTP %d, closed %v; want 503", code, closed)
	}
	if total, _ := s.guard.inFlight(""); total > 512*kib {
		t.Fatalf("listener holds %d bytes, budget 512 KiB", total)
	}
}

func mustProxies(t *testing.T, list string) *authlimit.Proxies {
	t.Helper()
	p, err := authlimit.ParseProxies(list)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestValidCredentialBehindAGuessingAddress: 31 bad credentials from one
// address, then the valid credential of an agent from the same address
// is accepted (old code: 429 for a minute). The guesses past the limit
// are slowed (429 after the penalty), and each request is checked once.
func TestValidCredentialBehindAGuessingAddress(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	s := guarded(t, st, Options{Listener: ListenerLimits{AuthFailurePenalty: 20 * time.Millisecond}})
	url := "http://" + s.Addr().String() + "/v1/opamp"
	uid := "0f0f0f0f-0000-4000-8000-00000000000a"
	cred, err := st.IssueAgentCredential(ctx, uid)
	if err != nil {
		t.Fatal(err)
	}
	msg := &protobufs.AgentToServer{InstanceUid: uidBytes(t, uid), Capabilities: uint64(protobufs.AgentCapabilities_AgentCapabilities_ReportsStatus)}
	for i := range 30 {
		if code, _ := post(t, url, store.CredentialPrefix+fmt.Sprint("guess", i), msg, false); code != http.StatusUnauthorized {
			t.Fatalf("guess %d: HTTP %d", i, code)
		}
	}
	if code, _ := post(t, url, store.CredentialPrefix+"guess-more", msg, false); code != http.StatusTooManyRequests {
		t.Fatalf("31st guess: HTTP %d, want 429", code)
	}
	if code, _ := post(t, url, cred, msg, false); code != http.StatusOK {
		t.Fatalf("valid credential from the guessing address: HTTP %d, want 200", code)
	}
	if !s.guard.guard.Slowed("127.0.0.1") {
		t.Fatal("the guessing address is not slowed")
	}
}

// TestSourceFromTrustedProxiesOnly: X-Forwarded-For and PROXY protocol
// (v1, v2) name the source only when the peer is a trusted proxy.
func TestSourceFromTrustedProxiesOnly(t *testing.T) {
	guess := func(t *testing.T, c net.Conn, xff string) int {
		t.Helper()
		h := "GET /v1/opamp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong-secret\r\nConnection: close\r\n"
		if xff != "" {
			h += "X-Forwarded-For: " + xff + "\r\n"
		}
		io.WriteString(c, h+"\r\n")
		code, _ := status(t, c, 20*time.Second)
		return code
	}
	dial := func(t *testing.T, s *Server, hdr *proxyproto.Header) net.Conn {
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if hdr != nil {
			if _, err := hdr.WriteTo(c); err != nil {
				t.Fatal(err)
			}
		}
		return c
	}
	client := func(ip string) *proxyproto.Header {
		return proxyproto.HeaderProxyFromAddrs(1, &net.TCPAddr{IP: net.ParseIP(ip), Port: 5555}, &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 4320})
	}
	t.Run("trusted", func(t *testing.T) {
		s := guarded(t, nil, Options{AuthFailuresPerMinute: 2, Listener: ListenerLimits{Proxies: mustProxies(t, "127.0.0.0/8")}})
		for range 2 {
			guess(t, dial(t, s, nil), "203.0.113.1")
		}
		v2 := client("203.0.113.2")
		v2.Version = 2
		for range 2 {
			if c := guess(t, dial(t, s, client("203.0.113.3")), ""); c != http.StatusUnauthorized {
				t.Fatalf("PROXY v1 guess: %d", c)
			}
			guess(t, dial(t, s, v2), "")
		}
		for _, src := range []string{"203.0.113.1", "203.0.113.2", "203.0.113.3"} {
			if !s.guard.guard.Slowed(src) {
				t.Errorf("the failures of %s were not counted on it", src)
			}
		}
		if s.guard.guard.Slowed("127.0.0.1") {
			t.Error("the proxy's own address was counted")
		}
	})
	t.Run("untrusted", func(t *testing.T) {
		s := guarded(t, nil, Options{AuthFailuresPerMinute: 2, Listener: ListenerLimits{Proxies: mustProxies(t, "10.9.9.9")}})
		for range 2 {
			guess(t, dial(t, s, nil), "203.0.113.1")
		}
		if s.guard.guard.Slowed("203.0.113.1") || !s.guard.guard.Slowed("127.0.0.1") {
			t.Fatal("X-Forwarded-For from an untrusted peer was believed")
		}
		c := dial(t, s, client("203.0.113.4"))
		if code := guess(t, c, ""); code != http.StatusBadRequest {
			t.Fatalf("a PROXY header from an untrusted peer: HTTP %d, want 400", code)
		}
	})
}
