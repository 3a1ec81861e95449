package artifacts

import (
	"context"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PathPrefix is where every replica serves the blobs: PathPrefix + digest.
const PathPrefix = "/artifacts/"

// URL is the download URL of a blob on a replica whose HTTP base URL is base.
func URL(base, digest string) string { return strings.TrimSuffix(base, "/") + PathPrefix + digest }

// AgentAuthorizer decides whether a request comes from an agent allowed to
// download. It is the single place where the artifact endpoint checks
// credentials.
type AgentAuthorizer func(r *http.Request) bool

// EnrollmentSecretAuth accepts the agents' enrollment secret as a bearer
// token, as the OpAMP endpoint does.
func EnrollmentSecretAuth(secret string) AgentAuthorizer {
	return func(r *http.Request) bool {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		return ok && secret != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(secret)) == 1
	}
}

// Handler serves GET/HEAD PathPrefix{digest} from the large objects, with
// Range, If-Range and If-None-Match (the ETag is the quoted digest; the
// content of a digest never changes).
func Handler(pool *pgxpool.Pool, auth AgentAuthorizer, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !auth(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="myriarch artifacts"`)
			http.Error(w, "unauthorized: an agent credential is required", http.StatusUnauthorized)
			return
		}
		digest := strings.TrimPrefix(r.URL.Path, PathPrefix)
		if !strings.HasPrefix(digest, "sha256:") || len(digest) != len("sha256:")+64 {
			http.Error(w, "not found: want "+PathPrefix+"sha256:<64 hex digits>", http.StatusNotFound)
			return
		}
		if err := serveBlob(r.Context(), pool, w, r, digest); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				http.Error(w, "no such artifact: "+digest, http.StatusNotFound)
				return
			}
			if r.Context().Err() == nil {
				log.Warn("serving an artifact failed", "digest", digest, "error", err)
				http.Error(w, "reading the artifact failed", http.StatusServiceUnavailable)
			}
		}
	})
}

func serveBlob(ctx context.Context, pool *pgxpool.Pool, w http.ResponseWriter, r *http.Request, digest string) error {
	// A large object is read inside a transaction; it holds one pool
	// connection for the duration of the response.
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var oid uint32
	var stored time.Time
	if err := tx.QueryRow(ctx, `SELECT lo_oid, stored_at FROM artifact_blobs WHERE digest = $1`, digest).Scan(&oid, &stored); err != nil {
		return err
	}
	los := tx.LargeObjects()
	obj, err := los.Open(ctx, oid, pgx.LargeObjectModeRead)
	if err != nil {
		return err
	}
	w.Header().Set("ETag", `"`+digest+`"`)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Cache-Control", "private, max-age=31536000, immutable")
	http.ServeContent(w, r, "", stored, obj)
	return nil
}
