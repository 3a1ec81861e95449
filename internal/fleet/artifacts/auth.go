package artifacts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/myriarch/myriarch/internal/fleet/authlimit"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// ErrUnauthorized is a download without an acceptable credential (401).
var ErrUnauthorized = errors.New("unauthorized")

// ErrTooManyFailures is a download from a source that failed to
// authenticate too often in the last minute (429, before any query).
var ErrTooManyFailures = errors.New("too many failed authentications from this source")

// AgentAuthorizer decides whether a request comes from an agent allowed to
// download the artifact of its path: nil to serve it, an error wrapping
// ErrUnauthorized or ErrTooManyFailures to refuse it, another error when the
// check itself failed (503). It is the single place where the artifact
// endpoint checks credentials.
type AgentAuthorizer func(r *http.Request) error

// Credentials is what AgentAuth asks the store (store.Store).
type Credentials interface {
	CheckAgentCredential(ctx context.Context, cred string) (uid string, ok bool, err error)
	AgentCredentialOf(ctx context.Context, uid string) (store.AgentCredential, bool, error)
}

// AgentAuth is the credential check of the artifact endpoint. It accepts,
// as a bearer token:
//   - a download token (tokens.go) issued for the artifact of the path, not
//     expired, of an agent that is not revoked: what package offers carry;
//   - an agent's own credential (mya_…, issue 17) that is not revoked, for
//     an artifact that is offered to that agent now (a row of
//     agent_package_offers with the path's digest): for an agent or tool
//     that downloads with its connection credential.
//
// It refuses the enrollment secret: that is shared by the whole fleet and
// cannot be revoked per agent (a revoked agent still knows it). Nor does a
// credential open an artifact that its agent was not offered: anyone who
// knows the secret can enroll once and get a credential. Mutual-TLS
// agents have no credential; their offers carry download tokens like
// everyone's (the HTTP listener does not ask for client certificates).
// A source that fails failuresPerMinute times is refused for the rest of
// the minute before its tokens cost a query.
func AgentAuth(creds Credentials, tokens *Tokens, failuresPerMinute int64) AgentAuthorizer {
	if failuresPerMinute <= 0 {
		failuresPerMinute = 30
	}
	failures := authlimit.New(failuresPerMinute)
	return func(r *http.Request) error {
		src := authlimit.Source(r)
		if failures.Blocked(src) {
			return ErrTooManyFailures
		}
		err := checkAgent(r, creds, tokens)
		if errors.Is(err, ErrUnauthorized) {
			failures.Add(src)
		}
		return err
	}
}

func checkAgent(r *http.Request, creds Credentials, tokens *Tokens) error {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return fmt.Errorf("%w: no bearer token", ErrUnauthorized)
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	switch {
	case strings.HasPrefix(tok, TokenPrefix):
		uid, err := tokens.Verify(ctx, tok, strings.TrimPrefix(r.URL.Path, PathPrefix))
		if err != nil {
			return err
		}
		c, known, err := creds.AgentCredentialOf(ctx, uid)
		if err != nil {
			return fmt.Errorf("checking whether agent %s is revoked: %w", uid, err)
		}
		if known && c.RevokedAt != nil {
			return fmt.Errorf("%w: agent %s is revoked", ErrUnauthorized, uid)
		}
		return nil
	case strings.HasPrefix(tok, store.CredentialPrefix):
		uid, ok, err := creds.CheckAgentCredential(ctx, tok)
		if err != nil {
			return fmt.Errorf("checking an agent credential: %w", err)
		}
		if !ok {
			return fmt.Errorf("%w: unknown or revoked agent credential", ErrUnauthorized)
		}
		digest := strings.TrimPrefix(r.URL.Path, PathPrefix)
		offered, err := offeredTo(ctx, tokens.pool, uid, digest)
		if err != nil {
			return fmt.Errorf("checking the offers of agent %s: %w", uid, err)
		}
		if !offered {
			return fmt.Errorf("%w: agent %s was not offered %s", ErrUnauthorized, uid, digest)
		}
		return nil
	}
	return fmt.Errorf("%w: not a download token or an agent credential (the enrollment secret is not accepted)", ErrUnauthorized)
}

// offeredTo reports whether an offer to agent uid names the blob digest.
func offeredTo(ctx context.Context, pool *pgxpool.Pool, uid, digest string) (bool, error) {
	if !validDigest(digest) {
		return false, nil
	}
	var ok bool
	err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM agent_package_offers WHERE instance_uid = $1 AND digest = $2)`,
		uid, digest).Scan(&ok)
	return ok, err
}

// refuse answers a request that auth refused. The reason goes to the log,
// not to the caller.
func refuse(w http.ResponseWriter, r *http.Request, err error, log *slog.Logger) {
	switch {
	case errors.Is(err, ErrTooManyFailures):
		w.Header().Set("Retry-After", authlimit.RetryAfter)
		http.Error(w, "too many failed authentications", http.StatusTooManyRequests)
	case errors.Is(err, ErrUnauthorized):
		log.Info("refused an artifact download", "source", authlimit.Source(r), "path", r.URL.Path, "reason", err)
		w.Header().Set("WWW-Authenticate", `Bearer realm="myriarch artifacts"`)
		http.Error(w, "unauthorized: a download token or agent credential is required", http.StatusUnauthorized)
	default:
		log.Warn("checking an artifact download's credential failed", "error", err)
		http.Error(w, "checking the credential failed; retry", http.StatusServiceUnavailable)
	}
}
