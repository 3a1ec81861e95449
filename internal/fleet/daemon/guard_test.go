package daemon

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"
	"google.golang.org/protobuf/proto"

	"github.com/myriarch/myriarch/internal/fleet/opampserver"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
)

var noRedirect = &http.Client{Timeout: 60 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// call makes one request and returns its status (the response is read).
func call(t *testing.T, hc *http.Client, method, u, bearer string, hdr map[string]string) int {
	t.Helper()
	req, _ := http.NewRequest(method, u, nil)
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// TestValidTokenBehindAGuessingAddress (issue 21 item 7): after more
// failed tokens from one address than server.authFailuresPerMinute, a
// valid API token, UI login and agent credential from the same address
// are accepted (the old limiter refused the whole address for a minute,
// valid tokens included); the guesses are slowed with 429. From a trusted
// proxy, X-Forwarded-For names the source.
func TestValidTokenBehindAGuessingAddress(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	d := startWith(t, pg.DSN(""), "replica-nat", map[string]string{"server.authFailuresPerMinute": "5",
		"server.authFailurePenalty": "100ms", "server.trustedProxies": "127.0.0.1"}, nil)
	defer d.Shutdown()
	_, tok, err := d.Store.IssueTokenRole(ctx, "viewer", store.RoleViewer)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + d.HTTPAddr().String()
	for i := range 5 {
		if c := call(t, noRedirect, "GET", base+"/api/v1/agents", fmt.Sprint("myr_guess", i), nil); c != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d", i, c)
		}
	}
	if c := call(t, noRedirect, "GET", base+"/api/v1/agents", "myr_guess-more", nil); c != http.StatusTooManyRequests {
		t.Fatalf("6th guess: %d, want 429", c)
	}
	if c := call(t, noRedirect, "GET", base+"/api/v1/agents", tok, nil); c != http.StatusOK {
		t.Fatalf("valid token from the guessing address: %d, want 200", c)
	}
	resp, err := noRedirect.PostForm(base+"/ui/login", url.Values{"token": {tok}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("UI login with a valid token from the guessing address: %d, want 303", resp.StatusCode)
	}
	// The trusted proxy (this test's own address) names another client:
	// its first failure is not slowed.
	if c := call(t, noRedirect, "GET", base+"/api/v1/agents", "myr_other", map[string]string{"X-Forwarded-For": "203.0.113.7"}); c != http.StatusUnauthorized {
		t.Fatalf("a guess of another client behind the proxy: %d, want 401", c)
	}

	// OpAMP: the same with agent credentials over plain HTTP.
	uid := "0f0f0f0f-0000-4000-8000-0000000000b1"
	cred, err := d.Store.IssueAgentCredential(ctx, uid)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := opampserver.ParseUID(uid)
	body, _ := proto.Marshal(&protobufs.AgentToServer{InstanceUid: raw})
	poll := func(bearer string) int {
		req, _ := http.NewRequest("POST", "http://"+d.OpAMPAddr().String()+"/v1/opamp", strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/x-protobuf")
		req.Header.Set("Authorization", "Bearer "+bearer)
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	for i := range 5 {
		if c := poll(fmt.Sprint(store.CredentialPrefix, "guess", i)); c != http.StatusUnauthorized {
			t.Fatalf("OpAMP guess %d: %d", i, c)
		}
	}
	if c := poll(store.CredentialPrefix + "guess-more"); c != http.StatusTooManyRequests {
		t.Fatalf("6th OpAMP guess: %d, want 429", c)
	}
	if c := poll(cred); c != http.StatusOK {
		t.Fatalf("valid agent credential from the guessing address: %d, want 200", c)
	}
}

// TestAPIAnswers503WithinTheRequestDeadline (issue 21 item 5): with the
// database frozen (the fault proxy forwards nothing, closes nothing), an
// API request with a token and a UI page with a session are answered 503
// by server.requestTimeout (2s here), not after the 15-20 s the stuck
// query took before. The client gives up after 12 s, so the old code
// fails this test.
func TestAPIAnswers503WithinTheRequestDeadline(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	proxy, err := pgtest.NewProxy(net.JoinHostPort(pg.Host, strconv.Itoa(pg.Port)), "")
	if err != nil {
		t.Fatal(err)
	}
	host, port := proxy.HostPort()
	dsn := fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", net.JoinHostPort(host, strconv.Itoa(port)))
	d := startWith(t, dsn, "replica-frozen", map[string]string{"server.requestTimeout": "2s"}, nil)
	defer d.Shutdown()
	defer proxy.Close() // first: unblocks the daemon's stuck queries
	_, tok, err := d.Store.IssueTokenRole(ctx, "viewer", store.RoleViewer)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + d.HTTPAddr().String()
	if c := call(t, noRedirect, "GET", base+"/api/v1/agents", tok, nil); c != http.StatusOK {
		t.Fatalf("before the freeze: %d", c)
	}
	resp, err := noRedirect.PostForm(base+"/ui/login", url.Values{"token": {tok}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cookies := resp.Cookies()
	if len(cookies) != 1 {
		t.Fatalf("login: %d %v", resp.StatusCode, cookies)
	}
	proxy.Freeze()
	impatient := &http.Client{Timeout: 12 * time.Second, CheckRedirect: noRedirect.CheckRedirect}
	start := time.Now()
	if c := call(t, impatient, "GET", base+"/api/v1/agents", tok, nil); c != http.StatusServiceUnavailable {
		t.Fatalf("API during the freeze: %d, want 503", c)
	}
	t.Logf("API answered 503 after %v", time.Since(start).Round(time.Millisecond))
	req, _ := http.NewRequest("GET", base+"/ui/", nil)
	req.AddCookie(cookies[0])
	start = time.Now()
	resp, err = impatient.Do(req)
	if err != nil {
		t.Fatalf("UI during the freeze: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("UI during the freeze: %d, want 503", resp.StatusCode)
	}
	t.Logf("UI answered 503 after %v", time.Since(start).Round(time.Millisecond))
}
