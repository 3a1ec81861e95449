package artifacts_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/artifacts"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
)

func openStore(t *testing.T) *store.Store {
	t.Helper()
	pg := pgtest.New(t)
	st, err := store.Open(context.Background(), pg.DSN(""), 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// The artifact endpoint's credential check, called in the test's own
// goroutine (so the tokens' clock can be moved between requests). No blob
// is stored: an accepted request gets 404 (no such artifact), a refused
// one 401 before the blob is looked up.
func TestArtifactDownloadAcceptsOnlyTheAgentsTokenOrOfferedCredential(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	tokens := artifacts.NewTokens(st.Pool)
	h := artifacts.Handler(st.Pool, artifacts.AgentAuth(st, tokens, 1000), nil)
	get := func(digest, auth string) int {
		t.Helper()
		r := httptest.NewRequest(http.MethodGet, artifacts.PathPrefix+digest, nil)
		if auth != "" {
			r.Header.Set("Authorization", "Bearer "+auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code == http.StatusUnauthorized && w.Header().Get("WWW-Authenticate") == "" {
			t.Fatal("401 without WWW-Authenticate")
		}
		return w.Code
	}
	const accepted, refused = http.StatusNotFound, http.StatusUnauthorized
	d1, d2 := digestOf([]byte("agent v1")), digestOf([]byte("agent v2"))
	const uidA, uidB = "0190a1b2-0000-4000-8000-00000000000a", "0190a1b2-0000-4000-8000-00000000000b"
	tokA, err := tokens.Issue(ctx, uidA, d1)
	if err != nil {
		t.Fatal(err)
	}
	tokB, err := tokens.Issue(ctx, uidB, d2)
	if err != nil {
		t.Fatal(err)
	}
	credA, err := st.IssueAgentCredential(ctx, uidA)
	if err != nil {
		t.Fatal(err)
	}
	// B enrolled too (anyone who knows the enrollment secret can) but was
	// offered nothing; A was offered d1 only.
	credB, err := st.IssueAgentCredential(ctx, uidB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool.Exec(ctx, `INSERT INTO agent_package_offers (instance_uid, package, version, asset, digest)
		VALUES ($1, 'otelcol', 'v1.0.0', 'otelcol.tgz', $2)`, uidA, d1); err != nil {
		t.Fatal(err)
	}

	if c := get(d1, ""); c != refused {
		t.Fatalf("no credential: %d", c)
	}
	if c := get(d1, "the-enrollment-secret"); c != refused {
		t.Fatalf("enrollment secret: %d", c)
	}
	if c := get(d1, tokA); c != accepted {
		t.Fatalf("A's token for its artifact: %d", c)
	}
	if c := get(d1, credA); c != accepted {
		t.Fatalf("A's own credential for the artifact offered to A: %d", c)
	}
	// A credential opens only what its agent was offered: one enrollment
	// does not open every artifact.
	if c := get(d2, credA); c != refused {
		t.Fatalf("A's credential for d2, not offered to A: %d", c)
	}
	if c := get(d1, credB); c != refused {
		t.Fatalf("B's credential (B offered nothing) for d1: %d", c)
	}
	if c := get("sha256:nothex", credA); c != refused {
		t.Fatalf("A's credential for a path that is no digest: %d", c)
	}
	// B's token is for another artifact; A's token for d1 does not open d2.
	if c := get(d1, tokB); c != refused {
		t.Fatalf("B's token for d2 used on d1: %d", c)
	}
	if c := get(d2, tokA); c != refused {
		t.Fatalf("A's token for d1 used on d2: %d", c)
	}
	// The agent named in a token cannot be changed: the MAC covers it.
	if c := get(d1, strings.Replace(tokA, uidA, uidB, 1)); c != refused {
		t.Fatalf("token with another uid: %d", c)
	}
	if c := get(d1, "mya_not-a-credential"); c != refused {
		t.Fatalf("unknown credential: %d", c)
	}

	// Another replica (its own Tokens, the same database) issues tokens
	// that this one accepts.
	tokC, err := artifacts.NewTokens(st.Pool).Issue(ctx, uidB, d1)
	if err != nil {
		t.Fatal(err)
	}
	if c := get(d1, tokC); c != accepted {
		t.Fatalf("token of another replica: %d", c)
	}

	// Expired: TokenTTL later the same token is refused.
	tokens.Now = func() time.Time { return time.Now().Add(artifacts.TokenTTL + time.Second) }
	if c := get(d1, tokA); c != refused {
		t.Fatalf("expired token: %d", c)
	}
	tokens.Now = time.Now

	// Revoked: A's token and credential stop working at once.
	if _, err := st.RevokeAgent(ctx, uidA, "test"); err != nil {
		t.Fatal(err)
	}
	if c := get(d1, tokA); c != refused {
		t.Fatalf("token of a revoked agent: %d", c)
	}
	if c := get(d1, credA); c != refused {
		t.Fatalf("credential of a revoked agent: %d", c)
	}
	if c := get(d1, tokC); c != accepted {
		t.Fatalf("B (not revoked): %d", c)
	}
}

// A source that keeps failing is refused before its tokens cost a query,
// even with a valid one.
func TestArtifactDownloadFailuresAreLimitedPerSource(t *testing.T) {
	st := openStore(t)
	tokens := artifacts.NewTokens(st.Pool)
	h := artifacts.Handler(st.Pool, artifacts.AgentAuth(st, tokens, 3), nil)
	d := digestOf([]byte("x"))
	good, err := tokens.Issue(context.Background(), "0190a1b2-0000-4000-8000-00000000000a", d)
	if err != nil {
		t.Fatal(err)
	}
	get := func(auth, src string) int {
		r := httptest.NewRequest(http.MethodGet, artifacts.PathPrefix+d, nil)
		r.RemoteAddr = src + ":4000"
		r.Header.Set("Authorization", "Bearer "+auth)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for range 3 {
		if c := get("wrong", "192.0.2.7"); c != http.StatusUnauthorized {
			t.Fatalf("bad token: %d", c)
		}
	}
	if c := get(good, "192.0.2.7"); c != http.StatusTooManyRequests {
		t.Fatalf("after 3 failures: %d", c)
	}
	if c := get(good, "192.0.2.8"); c != http.StatusNotFound {
		t.Fatalf("another source: %d", c)
	}
}

// The newest key signs; after KeyRotateAfter a new key takes over, and a
// token of the old key stays valid until it expires.
func TestDownloadTokenKeyRotation(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	t0 := time.Now()
	at := t0
	tokens := artifacts.NewTokens(st.Pool)
	tokens.Now = func() time.Time { return at }
	d := digestOf([]byte("x"))
	const uid = "0190a1b2-0000-4000-8000-00000000000a"
	kid := func(tok string) string {
		return strings.SplitN(strings.TrimPrefix(tok, artifacts.TokenPrefix), ".", 2)[0]
	}

	first, err := tokens.Issue(ctx, uid, d)
	if err != nil {
		t.Fatal(err)
	}
	at = t0.Add(artifacts.KeyRotateAfter - time.Minute)
	old, err := tokens.Issue(ctx, uid, d)
	if err != nil {
		t.Fatal(err)
	}
	if kid(old) != kid(first) {
		t.Fatalf("rotated early: %s then %s", kid(first), kid(old))
	}
	at = t0.Add(artifacts.KeyRotateAfter + time.Minute)
	// Another replica sees the same rotation.
	other := artifacts.NewTokens(st.Pool)
	other.Now = tokens.Now
	next, err := other.Issue(ctx, uid, d)
	if err != nil {
		t.Fatal(err)
	}
	mine, err := tokens.Issue(ctx, uid, d)
	if err != nil {
		t.Fatal(err)
	}
	if kid(next) == kid(old) || kid(mine) != kid(next) {
		t.Fatalf("keys: old %s, other replica %s, this replica %s", kid(old), kid(next), kid(mine))
	}
	for name, tok := range map[string]string{"old key": old, "new key": next} {
		if got, err := tokens.Verify(ctx, tok, d); err != nil || got != uid {
			t.Fatalf("%s: %q %v", name, got, err)
		}
	}
	if _, err := tokens.Verify(ctx, first, d); err == nil {
		t.Fatal("a token issued 30 days ago verifies")
	}
}

// BenchmarkDownloadToken measures what a download token costs: issuing one
// (per offered file), verifying one (MAC and expiry, cached key), and the
// whole check of a download request (verify plus the revocation query on
// a local PostgreSQL). Run: go test -run '^$' -bench DownloadToken
// ./internal/fleet/artifacts/
func BenchmarkDownloadToken(b *testing.B) {
	pg := pgtest.New(b)
	st, err := store.Open(context.Background(), pg.DSN(""), 4, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	tokens := artifacts.NewTokens(st.Pool)
	d := digestOf([]byte("x"))
	const uid = "0190a1b2-0000-4000-8000-00000000000a"
	tok, err := tokens.Issue(ctx, uid, d)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("issue", func(b *testing.B) {
		for b.Loop() {
			if _, err := tokens.Issue(ctx, uid, d); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("verify", func(b *testing.B) {
		for b.Loop() {
			if _, err := tokens.Verify(ctx, tok, d); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("request", func(b *testing.B) {
		auth := artifacts.AgentAuth(st, tokens, 1<<40)
		r := httptest.NewRequest(http.MethodGet, artifacts.PathPrefix+d, nil)
		r.Header.Set("Authorization", "Bearer "+tok)
		for b.Loop() {
			if err := auth(r); err != nil {
				b.Fatal(err)
			}
		}
	})
}
