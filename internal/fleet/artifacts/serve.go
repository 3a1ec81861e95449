package artifacts

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore"
)

// PathPrefix is where every replica serves the blobs: PathPrefix + digest.
const PathPrefix = "/artifacts/"

// URL is the download URL of a blob on a replica whose HTTP base URL is base.
func URL(base, digest string) string { return strings.TrimSuffix(base, "/") + PathPrefix + digest }

// Handler serves GET/HEAD PathPrefix{digest} from the store that holds the
// blob: the large objects (read in chunks of ChunkSize, each in its own
// short query) and, when given, the S3 store (ranged GETs), with Range,
// If-Range and If-None-Match (the ETag is the quoted digest; the content
// of a digest never changes).
func Handler(pool *pgxpool.Pool, auth AgentAuthorizer, log *slog.Logger, stores ...blobstore.Store) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	set := blobstore.NewSet(append([]blobstore.Store{blobstore.PG{Pool: pool}}, stores...)...)
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
		if err := serveBlob(r.Context(), pool, set, w, r, digest); err != nil {
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

func serveBlob(ctx context.Context, pool *pgxpool.Pool, set blobstore.Set, w http.ResponseWriter, r *http.Request, digest string) error {
	var ref blobstore.Ref
	var oid *uint32
	var key *string
	var stored time.Time
	if err := pool.QueryRow(ctx, `SELECT store, lo_oid, object_key, size, stored_at FROM artifact_blobs WHERE digest = $1`, digest).
		Scan(&ref.Kind, &oid, &key, &ref.Size, &stored); err != nil {
		return err
	}
	if oid != nil {
		ref.OID = *oid
	}
	if key != nil {
		ref.Key = *key
	}
	rd, err := set.Open(ctx, ref)
	if err != nil {
		return err
	}
	defer rd.Close()
	w.Header().Set("ETag", `"`+digest+`"`)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Cache-Control", "private, max-age=31536000, immutable")
	er := &errReader{r: rd}
	http.ServeContent(w, r, "", stored, er)
	// An error after the headers went out cuts the body short; the agent
	// sees a truncated download and its hash check fails.
	return er.err
}

// errReader keeps the first read error, which http.ServeContent swallows.
type errReader struct {
	r   io.ReadSeeker
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF && e.err == nil {
		e.err = err
	}
	return n, err
}

func (e *errReader) Seek(offset int64, whence int) (int64, error) { return e.r.Seek(offset, whence) }

// WriteProgressDeadline lets a response run as long as it makes progress.
// The HTTP server's write timeout (server.httpWriteTimeout) bounds a whole
// response, which is right for the API and wrong for an artifact: it cut
// every download that took longer (1,000 agents fetching 200 MiB from two
// replicas all failed at 60 s). Here each write of the body moves the
// deadline d ahead, so a client that stops reading is still cut off d
// after its last progress.
func WriteProgressDeadline(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		now := time.Now()
		if err := rc.SetWriteDeadline(now.Add(d)); err != nil {
			h.ServeHTTP(w, r) // no deadlines to move (not a net/http server)
			return
		}
		h.ServeHTTP(&progressWriter{ResponseWriter: w, rc: rc, d: d, moved: now}, r)
	})
}

// progressWriter moves the write deadline at most every d/4, so that a
// write never starts with less than 3d/4 left and the timer is not reset
// for every 32 KiB.
type progressWriter struct {
	http.ResponseWriter
	rc    *http.ResponseController
	d     time.Duration
	moved time.Time
}

func (p *progressWriter) Write(b []byte) (int, error) {
	if now := time.Now(); now.Sub(p.moved) >= p.d/4 {
		if err := p.rc.SetWriteDeadline(now.Add(p.d)); err != nil {
			return 0, err
		}
		p.moved = now
	}
	return p.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the server's writer.
func (p *progressWriter) Unwrap() http.ResponseWriter { return p.ResponseWriter }
