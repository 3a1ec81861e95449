package artifacts

import (
	"context"
	"errors"
	"fmt"
	"io"
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

// Handler serves GET/HEAD PathPrefix{digest} from the large objects (read
// in chunks of ChunkSize, each in its own short query), with
// Range, If-Range and If-None-Match (the ETag is the quoted digest; the
// content of a digest never changes).
func Handler(pool *pgxpool.Pool, auth AgentAuthorizer, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := auth(r); err != nil {
			refuse(w, r, err, log)
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
	var oid uint32
	var size int64
	var stored time.Time
	if err := pool.QueryRow(ctx, `SELECT lo_oid, size, stored_at FROM artifact_blobs WHERE digest = $1`, digest).Scan(&oid, &size, &stored); err != nil {
		return err
	}
	w.Header().Set("ETag", `"`+digest+`"`)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Cache-Control", "private, max-age=31536000, immutable")
	lr := &loReader{ctx: ctx, pool: pool, oid: oid, size: size}
	http.ServeContent(w, r, "", stored, lr)
	// An error after the headers went out cuts the body short; the agent
	// sees a truncated download and its hash check fails.
	return lr.err
}

// loReader reads a large object one chunk per query (lo_get), so that a
// download holds a pool connection only while a chunk is read, not while
// a slow agent receives the whole artifact.
type loReader struct {
	ctx  context.Context
	pool *pgxpool.Pool
	oid  uint32
	size int64
	off  int64
	err  error
}

func (l *loReader) Read(p []byte) (int, error) {
	if l.off >= l.size {
		return 0, io.EOF
	}
	n := min(int64(len(p)), l.size-l.off, ChunkSize)
	var b []byte
	if err := l.pool.QueryRow(l.ctx, `SELECT lo_get($1, $2, $3)`, l.oid, l.off, int32(n)).Scan(&b); err != nil {
		l.err = fmt.Errorf("reading bytes %d to %d: %w", l.off, l.off+n, err)
		return 0, l.err
	}
	if len(b) == 0 {
		return 0, io.ErrUnexpectedEOF
	}
	k := copy(p, b)
	l.off += int64(k)
	return k, nil
}

func (l *loReader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += l.off
	case io.SeekEnd:
		offset += l.size
	default:
		return 0, errors.New("seek: bad whence")
	}
	if offset < 0 {
		return 0, errors.New("seek: negative position")
	}
	l.off = offset
	return offset, nil
}
