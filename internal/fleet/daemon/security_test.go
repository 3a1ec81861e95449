package daemon

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/api"
	"github.com/myriarch/myriarch/internal/fleet/api/openapitest"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/fleet/ui"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// syncBuf is a log destination the test can read while the daemon writes.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func startWith(t *testing.T, dsn, replica string, extra map[string]string, logTo io.Writer) *Daemon {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if logTo == nil {
		logTo = io.Discard
	}
	d, err := Start(ctx, Options{Config: testConfig(t, dsn, replica, extra), Version: "test", Mount: ui.Mount,
		Log: slog.New(slog.NewTextHandler(logTo, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

var placeholder = regexp.MustCompile(`\{[^}]*\}`)

// concrete turns a route pattern into a method and a path; values names
// the value of each wildcard. A wildcard without a value fails the test
// naming the route, so that a new route gets a row here.
func concrete(t *testing.T, pattern string, values map[string]string) (string, string) {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok {
		method, path = "GET", pattern
	}
	if path == "/api/" {
		path = "/api/v1/no-such-endpoint"
	}
	path = placeholder.ReplaceAllStringFunc(path, func(w string) string {
		if w == "{$}" {
			return ""
		}
		v, ok := values[w]
		if !ok {
			t.Fatalf("route %q: no test value for %s; add one to the role table test", pattern, w)
		}
		return v
	})
	return method, path
}

// TestEveryEndpointEnforcesItsRole walks every registered API endpoint and
// UI route with no credentials, a revoked token, and a token of each role.
func TestEveryEndpointEnforcesItsRole(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	// The table makes hundreds of failed authentications from one address
	// on purpose; the per-source limit has its own test.
	d := startWith(t, pg.DSN(""), "replica-roles", map[string]string{"server.authFailuresPerMinute": "100000"}, nil)
	defer d.Shutdown()
	base := "http://" + d.HTTPAddr().String()

	uid := "0f0f0f0f-0000-4000-8000-0000000000aa"
	if _, err := d.Store.Connected(ctx, uid, "elsewhere", "x#1", time.Now()); err != nil {
		t.Fatal(err)
	}
	tokens := map[store.Role]string{}
	sessions := map[store.Role]string{}
	for _, r := range store.Roles {
		tk, tok, err := d.Store.IssueTokenRole(ctx, "t-"+string(r), r)
		if err != nil {
			t.Fatal(err)
		}
		tokens[r] = tok
		if sessions[r], err = d.Store.CreateSession(ctx, tk.ID, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	rev, revTok, _ := d.Store.IssueTokenRole(ctx, "revoked", store.RoleAdmin)
	revSession, _ := d.Store.CreateSession(ctx, rev.ID, time.Hour)
	if _, _, err := d.Store.RevokeToken(ctx, rev.ID, "test"); err != nil {
		t.Fatal(err)
	}
	victim, _, _ := d.Store.IssueTokenRole(ctx, "victim", store.RoleViewer)
	values := map[string]string{"{uid}": uid, "{id}": fmt.Sprint(victim.ID), "{name}": "edge", "{rev}": "1", "{command}": "pause"}

	// Every answer of every endpoint to every role is also checked
	// against the OpenAPI document.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Transport: openapitest.Transport(nil)}
	call := func(method, path, bearer, cookie string) int {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(`{"config": "a: 1"}`))
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		if cookie != "" {
			req.AddCookie(&http.Cookie{Name: ui.CookieName, Value: cookie})
		}
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}

	routes := d.API.Routes()
	if len(routes) < 10 {
		t.Fatalf("only %d API routes registered", len(routes))
	}
	checked := 0
	for _, rt := range routes {
		if rt.Role == api.Public {
			continue
		}
		method, path := concrete(t, rt.Pattern, values)
		name := method + " " + path
		if c := call(method, path, "", ""); c != http.StatusUnauthorized {
			t.Errorf("%s without a token: %d, want 401", name, c)
		}
		if c := call(method, path, revTok, ""); c != http.StatusUnauthorized {
			t.Errorf("%s with a revoked token: %d, want 401", name, c)
		}
		for _, r := range store.Roles {
			c := call(method, path, tokens[r], "")
			if r.Allows(rt.Role) && (c == http.StatusUnauthorized || c == http.StatusForbidden) {
				t.Errorf("%s (needs %s) with a %s token: %d", name, rt.Role, r, c)
			}
			if !r.Allows(rt.Role) && c != http.StatusForbidden {
				t.Errorf("%s (needs %s) with a %s token: %d, want 403", name, rt.Role, r, c)
			}
		}
		checked++
	}
	for _, rt := range ui.Routes() {
		if rt.Role == api.Public {
			continue
		}
		method, path := concrete(t, rt.Pattern, values)
		name := "UI " + method + " " + path
		if c := call(method, path, "", ""); c != http.StatusFound {
			t.Errorf("%s without a session: %d, want 302 to the login", name, c)
		}
		if c := call(method, path, "", revSession); c != http.StatusFound {
			t.Errorf("%s with the session of a revoked token: %d, want 302", name, c)
		}
		if c := call(method, path, "", tokens[store.RoleAdmin]); c != http.StatusFound {
			t.Errorf("%s with a raw token as the cookie: %d, want 302", name, c)
		}
		for _, r := range store.Roles {
			c := call(method, path, "", sessions[r])
			if r.Allows(rt.Role) && (c == http.StatusFound || c == http.StatusForbidden) {
				t.Errorf("%s (needs %s) with a %s session: %d", name, rt.Role, r, c)
			}
			if !r.Allows(rt.Role) && c != http.StatusForbidden {
				t.Errorf("%s (needs %s) with a %s session: %d, want 403", name, rt.Role, r, c)
			}
		}
		checked++
	}
	t.Logf("%d routes checked", checked)
}

func TestUISessionsAndCrossOriginForms(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	d := startWith(t, pg.DSN(""), "replica-ui", nil, nil)
	defer d.Shutdown()
	base := "http://" + d.HTTPAddr().String()
	_, tok, _ := d.Store.IssueTokenRole(ctx, "admin", store.RoleAdmin)
	uid := "0f0f0f0f-0000-4000-8000-0000000000bb"
	if _, err := d.Store.Connected(ctx, uid, "elsewhere", "x#1", time.Now()); err != nil {
		t.Fatal(err)
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	resp, err := noRedirect.PostForm(base+"/ui/login", url.Values{"token": {tok}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var sess *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == ui.CookieName {
			sess = c
		}
	}
	if resp.StatusCode != http.StatusSeeOther || sess == nil {
		t.Fatalf("login: %d %v", resp.StatusCode, resp.Cookies())
	}
	if sess.Value == tok || strings.Contains(sess.Value, tok) || !strings.HasPrefix(sess.Value, store.SessionPrefix) ||
		!sess.HttpOnly || sess.SameSite != http.SameSiteStrictMode || sess.MaxAge <= 0 {
		t.Fatalf("session cookie: %+v", sess)
	}

	post := func(path string, hdr map[string]string) int {
		req, _ := http.NewRequest("POST", base+path, nil)
		req.AddCookie(sess)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// A cross-origin form post is refused and changes nothing.
	for _, hdr := range []map[string]string{{"Sec-Fetch-Site": "cross-site"}, {"Origin": "http://evil.example"}} {
		if c := post("/ui/agents/"+uid+"/revoke", hdr); c != http.StatusForbidden {
			t.Fatalf("cross-origin POST %v: %d, want 403", hdr, c)
		}
	}
	if c, ok, _ := d.Store.AgentCredentialOf(ctx, uid); ok && c.RevokedAt != nil {
		t.Fatal("a cross-origin form revoked the agent")
	}
	// The same form from the same origin works.
	if c := post("/ui/agents/"+uid+"/revoke", map[string]string{"Sec-Fetch-Site": "same-origin"}); c != http.StatusSeeOther {
		t.Fatalf("same-origin POST: %d", c)
	}
	if c, ok, _ := d.Store.AgentCredentialOf(ctx, uid); !ok || c.RevokedAt == nil {
		t.Fatal("the revoke form did not revoke")
	}

	// Logout ends the session on the server: the old cookie no longer works.
	if c := post("/ui/logout", map[string]string{"Sec-Fetch-Site": "same-origin"}); c != http.StatusSeeOther {
		t.Fatalf("logout: %d", c)
	}
	req, _ := http.NewRequest("GET", base+"/ui/", nil)
	req.AddCookie(sess)
	resp, err = noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound {
		t.Fatalf("page after logout with the old cookie: %d, want 302", resp.StatusCode)
	}
	// Server-side expiry.
	tk, _, _ := d.Store.IssueTokenRole(ctx, "short", store.RoleViewer)
	id, err := d.Store.CreateSession(ctx, tk.ID, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := d.Store.CheckSession(ctx, id); !ok {
		t.Fatal("fresh session refused")
	}
	if !fleettest.Eventually(10*time.Second, func() bool { _, ok, _ := d.Store.CheckSession(ctx, id); return !ok }) {
		t.Fatal("the session did not expire")
	}
}

// writeCert writes a self-signed certificate for 127.0.0.1 with serial.
func writeCert(t *testing.T, dir string, serial int64) (string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "myriarchd"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	cf, kf := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	// Key first, then the certificate, each by rename, as a renewal would.
	for _, f := range []struct {
		name string
		blk  *pem.Block
	}{{kf, &pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}}, {cf, &pem.Block{Type: "CERTIFICATE", Bytes: der}}} {
		if err := os.WriteFile(f.name+".tmp", pem.EncodeToMemory(f.blk), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(f.name+".tmp", f.name); err != nil {
			t.Fatal(err)
		}
	}
	return cf, kf
}

func TestAPIOverTLSReloadsTheCertificateAndLimits(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	dir := t.TempDir()
	cf, kf := writeCert(t, dir, 1)
	d := startWith(t, pg.DSN(""), "replica-tls", map[string]string{"server.httpTlsCertFile": cf, "server.httpTlsKeyFile": kf,
		"server.maxRequestBytes": "8192", "server.authFailuresPerMinute": "5"}, nil)
	defer d.Shutdown()
	_, tok, _ := d.Store.IssueTokenRole(ctx, "op", store.RoleOperator)
	base := "https://" + d.HTTPAddr().String()
	serial := func() int64 {
		c, err := tls.Dial("tcp", d.HTTPAddr().String(), &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	if s := serial(); s != 1 {
		t.Fatalf("serial %d", s)
	}
	if d.httpSrv.ReadHeaderTimeout == 0 || d.httpSrv.ReadTimeout == 0 || d.httpSrv.WriteTimeout == 0 || d.httpSrv.IdleTimeout == 0 {
		t.Fatalf("timeouts not set: %+v", d.httpSrv)
	}
	time.Sleep(1100 * time.Millisecond) // a different modification time
	writeCert(t, dir, 2)
	if !fleettest.Eventually(30*time.Second, func() bool { return serial() == 2 }) {
		t.Fatal("the renewed certificate was never served")
	}
	// A broken renewal keeps the served certificate.
	os.WriteFile(cf, []byte("garbage"), 0o600)
	time.Sleep(1100 * time.Millisecond)
	if s := serial(); s != 2 {
		t.Fatalf("after a broken renewal: serial %d", s)
	}

	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path, bearer string, body io.Reader) (int, string) {
		req, _ := http.NewRequest(method, base+path, body)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// Behind TLS the session cookie is Secure.
	resp, err := hc.PostForm(base+"/ui/login", url.Values{"token": {tok}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if cs := resp.Cookies(); len(cs) != 1 || !cs[0].Secure {
		t.Fatalf("cookie behind TLS: %+v", cs)
	}
	// Body limit.
	if c, b := do("PUT", "/api/v1/agents/x/config", tok, strings.NewReader(`{"config": "`+strings.Repeat("a", 20000)+`"}`)); c != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized body: %d %s", c, b)
	}
	// Failed authentications: after 5 the guesses are slowed (429 after
	// the penalty), and a valid token from the same address still works.
	for i := range 5 {
		if c, _ := do("GET", "/api/v1/agents", fmt.Sprintf("myr_guess%d", i), nil); c != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d", i, c)
		}
	}
	if c, _ := do("GET", "/api/v1/agents", "myr_guess-more", nil); c != http.StatusTooManyRequests {
		t.Fatalf("6th guess: %d, want 429", c)
	}
	if c, _ := do("GET", "/api/v1/agents", tok, nil); c != http.StatusOK {
		t.Fatalf("valid token from a slowed source: %d, want 200", c)
	}
}

// TestRevokedAgentIsDisconnectedOnEveryReplica: the agent is connected to
// replica a; the revocation is made through replica b's API.
func TestRevokedAgentIsDisconnectedOnEveryReplica(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	a := startWith(t, pg.DSN(""), "replica-a", nil, nil)
	defer a.Shutdown()
	b := startWith(t, pg.DSN(""), "replica-b", nil, nil)
	defer b.Shutdown()
	ag, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + a.OpAMPAddr().String() + "/v1/opamp", Secret: secret, Credential: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Stop(ctx)
	if !fleettest.Eventually(30*time.Second, func() bool { return ag.Credential() != "" && a.OpAMP.Connections() == 1 }) {
		t.Fatal("agent never enrolled")
	}
	_, adminTok, _ := b.Store.IssueTokenRole(ctx, "admin", store.RoleAdmin)
	_, opTok, _ := b.Store.IssueTokenRole(ctx, "op", store.RoleOperator)
	onB := client{"http://" + b.HTTPAddr().String(), adminTok}
	if c := (client{onB.base, opTok}).do(t, "POST", "/api/v1/agents/"+ag.UIDString()+"/revoke", "", nil); c != http.StatusForbidden {
		t.Fatalf("operator revoke: %d", c)
	}
	var cred store.AgentCredential
	if c := onB.do(t, "POST", "/api/v1/agents/"+ag.UIDString()+"/revoke", "", &cred); c != http.StatusOK || cred.RevokedAt == nil {
		t.Fatalf("revoke: %d %+v", c, cred)
	}
	if !fleettest.Eventually(30*time.Second, func() bool { return a.OpAMP.Connections() == 0 }) {
		t.Fatal("the revoked agent is still connected to replica a")
	}
	if !fleettest.Eventually(30*time.Second, func() bool { return ag.ConnectFailures() > 0 }) {
		t.Fatal("no refused reconnect")
	}
	if ag.Connects() != 1 || a.OpAMP.Connections()+b.OpAMP.Connections() != 0 {
		t.Fatalf("the revoked agent connected again: %d connects", ag.Connects())
	}
}

// TestNoSecretsInLogsOrResponses runs the paths that handle secrets and
// greps everything the daemon logged and answered for them.
func TestNoSecretsInLogsOrResponses(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	var logs syncBuf
	d := startWith(t, pg.DSN(""), "replica-secrets", nil, &logs)
	stopped := false
	defer func() {
		if !stopped {
			d.Shutdown()
		}
	}()
	_, adminTok, _ := d.Store.IssueTokenRole(ctx, "admin", store.RoleAdmin)
	ag, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + d.OpAMPAddr().String() + "/v1/opamp", Secret: secret, Credential: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Stop(ctx)
	if !fleettest.Eventually(30*time.Second, func() bool { return ag.Credential() != "" }) {
		t.Fatal("no credential")
	}
	var answers strings.Builder
	do := func(method, path, bearer string) int {
		req, _ := http.NewRequest(method, "http://"+d.HTTPAddr().String()+path, nil)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Fprintf(&answers, "%s %s: %d %v %s\n", method, path, resp.StatusCode, resp.Header, b)
		return resp.StatusCode
	}
	do("GET", "/api/v1/agents/"+ag.UIDString(), adminTok)
	do("GET", "/api/v1/agents/"+ag.UIDString()+"/credential", adminTok)
	do("GET", "/api/v1/agents", "myr_"+secret)
	do("GET", "/api/v1/agents", ag.Credential())
	do("POST", "/api/v1/agents/"+ag.UIDString()+"/credential/rotate", adminTok)
	// The database goes away: generic 503s for unauthenticated callers.
	if err := pg.StopServer(ctx, "immediate"); err != nil {
		t.Fatal(err)
	}
	if c := do("GET", "/readyz", ""); c != http.StatusServiceUnavailable {
		t.Fatalf("readyz without the database: %d", c)
	}
	if c := do("GET", "/api/v1/agents", adminTok); c != http.StatusServiceUnavailable {
		t.Fatalf("token check without the database: %d", c)
	}
	ag.Stop(ctx)
	d.Shutdown()
	stopped = true
	out := answers.String()
	if !strings.Contains(out, "GET /readyz: 503") || !strings.Contains(out, "the token check is unavailable") ||
		strings.Contains(out, "dial") || strings.Contains(out, "refused") || strings.Contains(out, "SQLSTATE") || strings.Contains(out, "closed pool") {
		t.Errorf("a 503 shows internal detail:\n%s", out)
	}
	if !strings.Contains(logs.String(), "readiness check failed") {
		t.Error("the cause of the 503 is not in the log")
	}
	all := out + logs.String()
	for what, s := range map[string]string{"enrollment secret": secret, "admin token": adminTok, "agent credential": ag.Credential()} {
		if strings.Contains(all, s) {
			t.Errorf("the %s appears in a log line or a response", what)
		}
	}
}

// The agent page shows only the forms the session's role may use.
func TestUIShowsFormsByRole(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	d := startWith(t, pg.DSN(""), "replica-forms", nil, nil)
	defer d.Shutdown()
	uid := "0f0f0f0f-0000-4000-8000-0000000000cc"
	if _, err := d.Store.Connected(ctx, uid, "elsewhere", "x#1", time.Now()); err != nil {
		t.Fatal(err)
	}
	want := map[store.Role][]bool{store.RoleViewer: {false, false}, store.RoleOperator: {true, false}, store.RoleAdmin: {true, true}}
	for role, w := range want {
		tk, _, _ := d.Store.IssueTokenRole(ctx, string(role), role)
		id, _ := d.Store.CreateSession(ctx, tk.ID, time.Hour)
		req, _ := http.NewRequest("GET", "http://"+d.HTTPAddr().String()+"/ui/agents/"+uid, nil)
		req.AddCookie(&http.Cookie{Name: ui.CookieName, Value: id})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		page := string(b)
		if resp.StatusCode != 200 || strings.Contains(page, `id="restart-agent"`) != w[0] || strings.Contains(page, `id="revoke-agent"`) != w[1] {
			t.Errorf("%s: %d restart form %v, revoke form %v; want %v", role, resp.StatusCode,
				strings.Contains(page, `id="restart-agent"`), strings.Contains(page, `id="revoke-agent"`), w)
		}
	}
}
