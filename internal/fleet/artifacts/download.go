package artifacts

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore"
	"github.com/myriarch/myriarch/internal/fleet/jobs"
	"github.com/myriarch/myriarch/internal/fleet/releases"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/pgleader"
)

// ErrNotOwner is returned when the download's row names another term: a
// newer leader took the download over.
var ErrNotOwner = errors.New("the download belongs to a newer term")

// claim is a download as its owner sees it after claiming the row in a
// fenced transaction.
type claim struct {
	term  int64
	store string
	// oid is the large object (PostgreSQL) that the segments are written to.
	oid uint32
	// key, uploadID and parts are the multipart upload (S3) that the parts
	// are written to, and the parts recorded so far.
	key, uploadID string
	parts         []blobstore.Part
	// stale is an upload of a previous attempt that cannot be continued:
	// aborted once the claim committed.
	stale *blobstore.Upload
	// offset bytes are committed; hash is the sha256 state after them.
	offset  int64
	hash    []byte
	etag    string
	lastMod string
}

// inTerm runs fn in a transaction fenced by the job's own fence, with the
// term that fence checked.
func (p *Prefetcher) inTerm(ctx context.Context, fence jobs.Fence, fn func(ctx context.Context, tx pgx.Tx, term int64) error) error {
	return rollout.InTerm(ctx, fence, p.o.LockKey, fn)
}

// claim takes the download's row for this term. A download whose bytes
// and hash state a previous attempt committed is continued: into
// PostgreSQL, its large object; into S3, its multipart upload (checked
// against the store in download). Otherwise a previous large object is
// unlinked (a previous upload aborted) and a new one created.
func (p *Prefetcher) claim(ctx context.Context, fence jobs.Fence, w want) (c claim, err error) {
	c.store = blobstore.KindPG
	if p.o.StoreS3 {
		if p.o.S3 == nil {
			return c, errors.New("storing in S3 needs an S3 store")
		}
		c.store = blobstore.KindS3
	}
	err = p.inTerm(ctx, fence, func(ctx context.Context, tx pgx.Tx, term int64) error {
		c.term = term
		c.key, c.uploadID, c.parts, c.stale, c.oid, c.offset, c.hash, c.etag, c.lastMod = "", "", nil, nil, 0, 0, nil, "", ""
		var (
			store, state  string
			oid           *uint32
			written       int64
			hst           []byte
			etag, lastMod string
			exists        bool
			key, upload   *string
			parts         []byte
		)
		err := tx.QueryRow(ctx, `SELECT store, state, lo_oid, written, hash_state, source_etag, source_last_modified,
				lo_oid IS NOT NULL AND EXISTS (SELECT 1 FROM pg_largeobject_metadata m WHERE m.oid = d.lo_oid),
				s3_key, s3_upload_id, s3_parts
			FROM artifact_downloads d WHERE digest = $1 FOR UPDATE`, w.Digest).
			Scan(&store, &state, &oid, &written, &hst, &etag, &lastMod, &exists, &key, &upload, &parts)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		hasUpload := key != nil && upload != nil && *upload != ""
		los := tx.LargeObjects()
		switch {
		case c.store == blobstore.KindPG && store == blobstore.KindPG && exists && written > 0 && hst != nil && state != "done":
			c.oid, c.offset, c.hash, c.etag, c.lastMod = *oid, written, hst, etag, lastMod
		case c.store == blobstore.KindS3 && store == blobstore.KindS3 && hasUpload && written > 0 && hst != nil && state != "done" &&
			json.Unmarshal(parts, &c.parts) == nil:
			c.key, c.uploadID, c.offset, c.hash, c.etag, c.lastMod = *key, *upload, written, hst, etag, lastMod
		default:
			c.parts = nil
			if exists {
				if err := los.Unlink(ctx, *oid); err != nil {
					return err
				}
			}
			if hasUpload {
				c.stale = &blobstore.Upload{Key: *key, ID: *upload}
			}
			if c.store == blobstore.KindPG {
				if c.oid, err = los.Create(ctx, 0); err != nil {
					return err
				}
			}
		}
		var oidArg *uint32
		if c.oid != 0 {
			oidArg = &c.oid
		}
		var keyArg, uploadArg *string
		var partsArg []byte
		if c.uploadID != "" {
			keyArg, uploadArg = &c.key, &c.uploadID
			if partsArg, err = json.Marshal(c.parts); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `INSERT INTO artifact_downloads (digest, package, version, asset, state, bytes, total, attempts, error, replica_id, term, updated_at,
				store, lo_oid, written, hash_state, source_etag, source_last_modified, resumed_from, s3_key, s3_upload_id, s3_parts)
			VALUES ($1, $2, $3, $4, 'downloading', $5, $6, 1, '', $7, $8, now(), $9, $10, $5, $11, $12, $13, $5, $14, $15, $16)
			ON CONFLICT (digest) DO UPDATE SET package = $2, version = $3, asset = $4, state = 'downloading', bytes = $5, total = $6,
				attempts = artifact_downloads.attempts + 1, error = '', replica_id = $7, term = $8, updated_at = now(),
				store = $9, lo_oid = $10, written = $5, hash_state = $11, source_etag = $12, source_last_modified = $13, resumed_from = $5,
				s3_key = $14, s3_upload_id = $15, s3_parts = $16`,
			w.Digest, w.pkg, w.version, w.Name, c.offset, w.Size, p.o.Replica, term, c.store, oidArg, c.hash, c.etag, c.lastMod,
			keyArg, uploadArg, partsArg)
		return err
	})
	if err == nil && c.stale != nil {
		p.abortUpload(ctx, *c.stale)
	}
	return c, err
}

// abortUpload aborts an upload that no attempt will continue. A failure
// leaves it to retention, which aborts the uploads that no download row
// names.
func (p *Prefetcher) abortUpload(ctx context.Context, u blobstore.Upload) {
	if p.o.S3 == nil {
		return
	}
	if err := p.o.S3.AbortUpload(context.WithoutCancel(ctx), u.Key, u.ID); err != nil && !errors.Is(err, blobstore.ErrNoUpload) {
		p.log.Warn("aborting an S3 multipart upload failed; retention will", "key", u.Key, "upload", u.ID, "error", err)
	}
}

// dropUpload gives up the claim's upload: the download starts again from
// byte 0 in a new upload. The row stops naming the upload first, in a
// transaction that checks under the row lock that the download is still
// this term's; only then is the upload aborted. A claimer that lost its
// term meanwhile (paused between its claim and here) gets the stale-term
// error and leaves alone the upload that the newer term continues.
func (p *Prefetcher) dropUpload(ctx context.Context, fence jobs.Fence, w want, c *claim) error {
	if c.uploadID != "" {
		err := p.inTerm(ctx, fence, func(ctx context.Context, tx pgx.Tx, _ int64) error {
			if err := owns(ctx, tx, w.Digest, c.term); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE artifact_downloads SET written = 0, bytes = 0, hash_state = NULL, s3_key = NULL, s3_upload_id = NULL, s3_parts = NULL,
				updated_at = now() WHERE digest = $1`, w.Digest)
			return err
		})
		if err != nil {
			return fmt.Errorf("giving up upload %s of %s: %w", c.uploadID, c.key, err)
		}
		p.abortUpload(ctx, blobstore.Upload{Key: c.key, ID: c.uploadID})
	}
	c.key, c.uploadID, c.parts, c.offset = "", "", nil, 0
	return nil
}

// checkUpload makes sure that the multipart upload the claim continues is
// still the one recorded: the parts the store lists begin with the recorded
// ones (number, ETag, size), which add up to the committed bytes. Otherwise (the upload
// vanished, a part differs) it is dropped and the download starts from
// byte 0; so does a store that answers that it does not list parts
// (blobstore.CannotList). Any other error (the store unreachable, a 5xx,
// SlowDown) is returned and the upload kept: the next attempt tries the
// resume again.
func (p *Prefetcher) checkUpload(ctx context.Context, fence jobs.Fence, w want, c *claim, log *slog.Logger) error {
	if c.uploadID == "" {
		return nil
	}
	why := "no bytes to continue from"
	if c.offset > 0 {
		got, err := p.o.S3.Parts(ctx, c.key, c.uploadID)
		switch {
		case errors.Is(err, blobstore.ErrNoUpload):
			why = "the store no longer has the upload"
		case blobstore.CannotList(err):
			// A store that cannot list the parts (not every S3-compatible
			// one implements it) still gets the blob, from byte 0.
			why = "the store does not list the parts: " + err.Error()
		case err != nil:
			return fmt.Errorf("listing the parts of upload %s of %s in %s: %w", c.uploadID, c.key, p.o.S3, err)
		default:
			if why = partsDiffer(got, c.parts, c.offset); why == "" {
				return nil
			}
		}
	}
	log.Warn("artifact upload cannot be continued; starting again from byte 0", "key", c.key, "upload", c.uploadID, "committed", c.offset, "reason", why)
	return p.dropUpload(ctx, fence, w, c)
}

// partsDiffer says how the listed parts differ from the recorded ones, or
// "" when they begin with the recorded ones and those add up to offset.
// Parts after the recorded ones are of an attempt that ended between a
// part's upload and its record: the continuation uploads those part
// numbers again (which replaces them), and the upload is completed with the
// recorded list, which leaves out any other.
func partsDiffer(got, rec []blobstore.Part, offset int64) string {
	if len(got) < len(rec) {
		return fmt.Sprintf("the store lists %d parts, %d were recorded", len(got), len(rec))
	}
	var sum int64
	for i := range rec {
		if got[i] != rec[i] || rec[i].Number != i+1 {
			return fmt.Sprintf("part %d: the store lists %+v, recorded %+v", i+1, got[i], rec[i])
		}
		sum += rec[i].Size
	}
	if sum != offset {
		return fmt.Sprintf("the recorded parts hold %d bytes, %d were committed", sum, offset)
	}
	return ""
}

// source is the open content stream of an asset.
type source struct {
	body io.ReadCloser
	// from is the offset of the body's first byte.
	from          int64
	etag, lastMod string
}

// open returns the asset's content from offset when the source can
// continue there (a 206 for the same content), else from byte 0.
func (p *Prefetcher) open(ctx context.Context, a releases.Asset, offset int64, etag, lastMod string) (source, error) {
	// OCI assets are addressed as repository@digest; others are plain URLs.
	if strings.Contains(a.URL, "@sha256:") {
		rc, err := releases.OpenOCI(ctx, p.o.Client, a.URL, a.Size)
		return source{body: rc}, err
	}
	get := func(offset int64) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.URL, nil)
		if err != nil {
			return nil, err
		}
		if offset > 0 {
			req.Header.Set("Range", fmt.Sprintf("bytes=%d-", offset))
			// The source answers 200 (the whole content) if it changed.
			if etag != "" && !strings.HasPrefix(etag, "W/") {
				req.Header.Set("If-Range", etag)
			} else if lastMod != "" {
				req.Header.Set("If-Range", lastMod)
			}
		}
		return p.o.Client.Do(req)
	}
	resp, err := get(offset)
	if err != nil {
		return source{}, err
	}
	if offset > 0 && resp.StatusCode == http.StatusRequestedRangeNotSatisfiable {
		// Nothing after offset (every byte of an asset of unrecorded size
		// was committed) or a shorter content: start again, simply.
		resp.Body.Close()
		if resp, err = get(0); err != nil {
			return source{}, err
		}
	} else if offset > 0 && resp.StatusCode == http.StatusPartialContent {
		same := resp.Header.Get("ETag") == etag && resp.Header.Get("Last-Modified") == lastMod
		if start, ok := contentRangeStart(resp.Header.Get("Content-Range")); ok && start == offset && same {
			return source{body: resp.Body, from: offset, etag: etag, lastMod: lastMod}, nil
		}
		// Not the continuation of the same content: start again.
		resp.Body.Close()
		if resp, err = get(0); err != nil {
			return source{}, err
		}
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return source{}, fmt.Errorf("GET %s: %s", a.URL, resp.Status)
	}
	return source{body: resp.Body, etag: resp.Header.Get("ETag"), lastMod: resp.Header.Get("Last-Modified")}, nil
}

// contentRangeStart parses the first byte of "bytes first-last/total".
func contentRangeStart(v string) (int64, bool) {
	r, ok := strings.CutPrefix(v, "bytes ")
	if !ok {
		return 0, false
	}
	first, _, ok := strings.Cut(r, "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(first, 10, 64)
	return n, err == nil
}

// download streams one asset into the store and makes it servable only
// once verified.
func (p *Prefetcher) download(ctx context.Context, fence jobs.Fence, w want) (err error) {
	log := p.log.With("package", w.pkg, "version", w.version, "asset", w.Name, "digest", w.Digest)
	if !strings.HasPrefix(w.Digest, "sha256:") {
		p.mFailures.WithLabelValues("digest").Inc()
		return fmt.Errorf("asset %s of %s %s: digest %q: only sha256 is supported", w.Name, w.pkg, w.version, w.Digest)
	}
	c, err := p.claim(ctx, fence, w)
	if err != nil {
		return fmt.Errorf("asset %s of %s %s (%s): claiming the download: %w", w.Name, w.pkg, w.version, w.Digest, err)
	}
	var done atomic.Int64
	done.Store(c.offset)
	reason := "source"
	// reset: the bytes written so far are worthless (a digest mismatch).
	reset := false
	defer func() {
		p.mCurBytes.DeleteLabelValues(w.Digest)
		p.mCurTotal.DeleteLabelValues(w.Digest)
		if err == nil || ctx.Err() != nil {
			return
		}
		p.mFailures.WithLabelValues(reason).Inc()
		log.Warn("artifact download failed", "bytes", done.Load(), "error", err)
		err = fmt.Errorf("asset %s of %s %s (%s): %w", w.Name, w.pkg, w.version, w.Digest, err)
		if ferr := p.failed(ctx, fence, w, c, done.Load(), err, reset); ferr != nil {
			err = errors.Join(err, ferr)
		}
	}()
	if err := releases.VerifySignature(w.publicKey, w.Digest, w.Signature); err != nil {
		reason, reset = "signature", true
		return err
	}
	h := sha256.New()
	if c.offset > 0 {
		if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(c.hash); err != nil {
			// A state this build cannot read: start again.
			h.Reset()
			c.offset = 0
		}
	}
	if c.store == blobstore.KindS3 {
		if err := p.checkUpload(ctx, fence, w, &c, log); err != nil {
			reason = "store"
			return err
		}
		if c.offset == 0 {
			h.Reset()
		}
	}
	var src source
	if c.offset > 0 && w.Size >= 0 && c.offset == w.Size {
		// Every byte was committed before the failover; only the
		// verification and the row remain.
		src = source{body: io.NopCloser(strings.NewReader("")), from: c.offset, etag: c.etag, lastMod: c.lastMod}
	} else if src, err = p.open(ctx, w.Asset, c.offset, c.etag, c.lastMod); err != nil {
		return err
	}
	defer src.body.Close()
	if src.from != c.offset {
		h.Reset()
		log.Info("artifact download starts from byte 0", "committed", c.offset, "size", w.Size)
		if err := p.dropUpload(ctx, fence, w, &c); err != nil {
			reason = "store"
			return err
		}
	} else if c.offset > 0 {
		p.mResumed.Inc()
		log.Info("artifact download resumed", "from", c.offset, "size", w.Size)
	} else {
		log.Info("artifact download started", "size", w.Size, "store", c.store)
	}
	done.Store(src.from)
	p.mCurTotal.WithLabelValues(w.Digest).Set(float64(w.Size))
	stopReporter := p.reportProgress(ctx, fence, w, c.term, &done, log)
	defer stopReporter()

	var n int64
	var key string
	if c.store == blobstore.KindS3 {
		key, n, err = p.toS3(ctx, w, &c, src, h, &done, &reason)
	} else {
		n, err = p.toPG(ctx, w, c, src, h, &done, &reason)
	}
	if err != nil {
		// Bytes beyond the recorded size are not worth continuing.
		reset = reason == "size"
		return err
	}
	stopReporter()
	if err := verify(h, w.Digest, n, w.Size); err != nil {
		reason, reset = "digest", true
		if key != "" && c.uploadID == "" {
			_ = p.o.S3.Delete(context.WithoutCancel(ctx), key)
		}
		return err
	}
	if c.uploadID != "" {
		// Only a verified upload becomes an object. The check narrows the
		// window in which a leader that lost its term completes an upload
		// that the new leader continues (which then finds it gone and
		// starts again, or, on AWS S3, completes it again: a repeated
		// Complete succeeds). Either way the object is the newer term's
		// to register, so a refused final transaction below never
		// deletes it.
		reason = "store"
		if err := p.inTerm(ctx, fence, func(ctx context.Context, tx pgx.Tx, _ int64) error { return owns(ctx, tx, w.Digest, c.term) }); err != nil {
			return err
		}
		if err := p.o.S3.CompleteUpload(ctx, c.key, c.uploadID, c.parts); err != nil {
			return fmt.Errorf("completing upload %s of %s in %s: %w", c.uploadID, c.key, p.o.S3, err)
		}
	}
	// The term is checked in the same transaction, right before the row
	// that makes the blob servable. committing: the statements ran and the
	// COMMIT was sent, so an error after it leaves the outcome unknown.
	committing := false
	err = p.inTerm(ctx, fence, func(ctx context.Context, tx pgx.Tx, term int64) error {
		if err := owns(ctx, tx, w.Digest, c.term); err != nil {
			return err
		}
		var oid *uint32
		var objKey *string
		if c.store == blobstore.KindPG {
			oid = &c.oid
		} else {
			objKey = &key
		}
		if _, err := tx.Exec(ctx, `INSERT INTO artifact_blobs (digest, store, lo_oid, object_key, size, term) VALUES ($1, $2, $3, $4, $5, $6)`,
			w.Digest, c.store, oid, objKey, n, term); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE artifact_downloads SET state = 'done', bytes = $2, written = $2, error = '', lo_oid = NULL, hash_state = NULL,
			s3_key = NULL, s3_upload_id = NULL, s3_parts = NULL, updated_at = now() WHERE digest = $1`, w.Digest, n)
		committing = err == nil
		return err
	})
	if err != nil {
		reason = "store"
		if key != "" && c.uploadID == "" && !committing {
			// The object of a single PUT has a key of this attempt alone and
			// no row names it: garbage, deleted now (retention would too).
			// The object of a multipart upload is not deleted: its key is
			// the upload's, shared by every term that continued it, and a
			// newer term may have completed it too and registered it (a
			// repeated Complete of a completed upload succeeds on AWS S3).
			// Nor is one whose COMMIT may have succeeded. Retention's sweep
			// removes them once no blob row names them.
			_ = p.o.S3.Delete(context.WithoutCancel(ctx), key)
		}
		return err
	}
	p.mBlobs.Inc()
	log.Info("artifact stored", "bytes", n, "store", c.store)
	return nil
}

// owns checks under the row lock that the download still belongs to term;
// the lock is held until the caller's transaction ends, so no newer
// leader can take the download over between the check and the commit.
func owns(ctx context.Context, tx pgx.Tx, digest string, term int64) error {
	var cur int64
	if err := tx.QueryRow(ctx, `SELECT term FROM artifact_downloads WHERE digest = $1 FOR UPDATE`, digest).Scan(&cur); err != nil {
		return fmt.Errorf("checking the owner of the download: %w", err)
	}
	if cur != term {
		return &pgleader.StaleTermError{Term: term, Current: cur, Reason: ErrNotOwner.Error()}
	}
	return nil
}

// toPG writes the source into the large object in segments of
// SegmentSize, each committed with the bytes and hash state after it.
func (p *Prefetcher) toPG(ctx context.Context, w want, c claim, src source, h hash.Hash, done *atomic.Int64, reason *string) (int64, error) {
	n := src.from
	buf := make([]byte, ChunkSize)
	for {
		eof, err := p.segment(ctx, w, c, src, h, buf, &n, done, reason)
		if err != nil {
			return n, err
		}
		if eof {
			return n, nil
		}
	}
}

// segment writes up to SegmentSize bytes in one transaction. It does not
// hold the term row while it reads the source (a slow source would delay
// the next election); it checks at commit, under the download row's lock,
// that the download is still this term's.
func (p *Prefetcher) segment(ctx context.Context, w want, c claim, src source, h hash.Hash, buf []byte, n *int64, done *atomic.Int64, reason *string) (eof bool, err error) {
	*reason = "store"
	tx, err := p.o.Pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	los := tx.LargeObjects()
	obj, err := los.Open(ctx, c.oid, pgx.LargeObjectModeWrite)
	if err != nil {
		return false, err
	}
	// Bytes past the committed ones are from an attempt that did not
	// commit, or of content that changed: cut them.
	if err := obj.Truncate(*n); err != nil {
		return false, err
	}
	if _, err := obj.Seek(*n, io.SeekStart); err != nil {
		return false, err
	}
	start := *n
	for *n-start < p.o.SegmentSize {
		k, rerr := io.ReadFull(src.body, buf)
		if k > 0 {
			h.Write(buf[:k])
			if _, err := obj.Write(buf[:k]); err != nil {
				return false, err
			}
			*n += int64(k)
			done.Store(*n)
			p.mBytes.Add(float64(k))
			p.mCurBytes.WithLabelValues(w.Digest).Set(float64(*n))
			if w.Size >= 0 && *n > w.Size {
				*reason = "size"
				return false, fmt.Errorf("more than the recorded size of %d bytes", w.Size)
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			eof = true
			break
		}
		if rerr != nil {
			*reason = "source"
			return false, rerr
		}
	}
	if err := obj.Close(); err != nil {
		return false, err
	}
	st, err := h.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		return false, err
	}
	if err := owns(ctx, tx, w.Digest, c.term); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `UPDATE artifact_downloads SET written = $2, bytes = $2, hash_state = $3, source_etag = $4, source_last_modified = $5,
		resumed_from = $6, updated_at = now() WHERE digest = $1`, w.Digest, *n, st, src.etag, src.lastMod, src.from); err != nil {
		return false, err
	}
	return eof, tx.Commit(ctx)
}

// toS3 uploads the source in the parts of a multipart upload, each
// recorded once the store has it with the bytes and the hash state after
// it, so that a new leader continues the upload. A blob that fits in one
// part is uploaded with one PUT (nothing worth continuing). It returns the
// object key.
func (p *Prefetcher) toS3(ctx context.Context, w want, c *claim, src source, h hash.Hash, done *atomic.Int64, reason *string) (string, int64, error) {
	n := src.from
	buf := make([]byte, p.o.S3PartSize)
	for {
		k, eof, err := p.fill(buf, src.body, h, w, &n, done, reason)
		if err != nil {
			return c.key, n, err
		}
		if eof && c.uploadID == "" {
			key := p.s3Key(w, c.term)
			*reason = "store"
			if err := p.o.S3.Put(ctx, key, bytes.NewReader(buf[:k]), int64(k)); err != nil {
				_ = p.o.S3.Delete(context.WithoutCancel(ctx), key)
				return "", n, fmt.Errorf("uploading to %s: %w", p.o.S3, err)
			}
			return key, n, nil
		}
		if k > 0 {
			if err := p.putPart(ctx, w, c, buf[:k], n, h, src, reason); err != nil {
				return c.key, n, err
			}
		}
		if eof {
			return c.key, n, nil
		}
	}
}

// s3Key is the key of a new upload: every upload its own, so that one of a
// leader that lost its term never overwrites a servable object.
func (p *Prefetcher) s3Key(w want, term int64) string {
	var nonce [6]byte
	_, _ = rand.Read(nonce[:])
	return p.o.S3.Key(w.Digest, fmt.Sprintf("t%d-%s", term, hex.EncodeToString(nonce[:])))
}

// fill reads the next part into buf (until it is full or the source ends),
// hashing and counting as it goes.
func (p *Prefetcher) fill(buf []byte, r io.Reader, h hash.Hash, w want, n *int64, done *atomic.Int64, reason *string) (k int, eof bool, err error) {
	for k < len(buf) {
		m, rerr := r.Read(buf[k:min(len(buf), k+ChunkSize)])
		if m > 0 {
			h.Write(buf[k : k+m])
			k += m
			*n += int64(m)
			done.Store(*n)
			p.mBytes.Add(float64(m))
			p.mCurBytes.WithLabelValues(w.Digest).Set(float64(*n))
			if w.Size >= 0 && *n > w.Size {
				*reason = "size"
				return k, false, fmt.Errorf("more than the recorded size of %d bytes", w.Size)
			}
		}
		if rerr == io.EOF {
			return k, true, nil
		}
		if rerr != nil {
			*reason = "source"
			return k, false, rerr
		}
	}
	return k, false, nil
}

// putPart uploads b as the next part (starting the upload with the first
// one) and records it with the bytes n and the hash state after it. The
// record commits only while the download is still this term's, checked
// under the row lock as for a segment of a large object.
func (p *Prefetcher) putPart(ctx context.Context, w want, c *claim, b []byte, n int64, h hash.Hash, src source, reason *string) error {
	*reason = "store"
	if c.uploadID == "" {
		c.key = p.s3Key(w, c.term)
		id, err := p.o.S3.NewUpload(ctx, c.key)
		if err != nil {
			return fmt.Errorf("uploading to %s: starting a multipart upload: %w", p.o.S3, err)
		}
		c.uploadID = id
	}
	part, err := p.o.S3.PutPart(ctx, c.key, c.uploadID, len(c.parts)+1, b)
	if err != nil {
		return fmt.Errorf("uploading to %s: part %d: %w", p.o.S3, len(c.parts)+1, err)
	}
	c.parts = append(c.parts, part)
	st, err := h.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		return err
	}
	parts, err := json.Marshal(c.parts)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, p.o.Pool, func(tx pgx.Tx) error {
		if err := owns(ctx, tx, w.Digest, c.term); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE artifact_downloads SET written = $2, bytes = $2, hash_state = $3, source_etag = $4, source_last_modified = $5,
			resumed_from = $6, s3_key = $7, s3_upload_id = $8, s3_parts = $9, updated_at = now() WHERE digest = $1`,
			w.Digest, n, st, src.etag, src.lastMod, src.from, c.key, c.uploadID, parts)
		return err
	})
}

// reportProgress writes, logs and exports the progress on a timer, so a
// stalled source shows as bytes that stop growing rather than as no report
// at all. The returned function stops it (idempotent).
func (p *Prefetcher) reportProgress(ctx context.Context, fence jobs.Fence, w want, term int64, done *atomic.Int64, log *slog.Logger) func() {
	stopped := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(p.o.ProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				k := done.Load()
				log.Info("artifact download progress", "bytes", k, "size", w.Size, "percent", percent(k, w.Size))
				_ = fence(ctx, func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `UPDATE artifact_downloads SET bytes = $2, updated_at = now() WHERE digest = $1 AND term = $3 AND state = 'downloading'`,
						w.Digest, k, term)
					return err
				})
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(stop); <-stopped }) }
}

// failed records a failed attempt. reset drops the bytes written so far
// (the next attempt starts from byte 0); otherwise they stay for a resume.
func (p *Prefetcher) failed(ctx context.Context, fence jobs.Fence, w want, c claim, n int64, cause error, reset bool) error {
	err := fence(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if err := owns(ctx, tx, w.Digest, c.term); err != nil {
			return err
		}
		if reset {
			if c.oid != 0 {
				los := tx.LargeObjects()
				if err := los.Unlink(ctx, c.oid); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, `UPDATE artifact_downloads SET state = 'failed', bytes = $2, error = $3, lo_oid = NULL, written = 0, hash_state = NULL,
				s3_key = NULL, s3_upload_id = NULL, s3_parts = NULL, updated_at = now() WHERE digest = $1`, w.Digest, n, cause.Error())
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE artifact_downloads SET state = 'failed', bytes = $2, error = $3, updated_at = now() WHERE digest = $1`,
			w.Digest, n, cause.Error())
		return err
	})
	if err == nil && reset && c.uploadID != "" {
		p.abortUpload(ctx, blobstore.Upload{Key: c.key, ID: c.uploadID})
	}
	return err
}

func verify(h hash.Hash, want string, n, size int64) error {
	got := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if size >= 0 && n != size {
		return fmt.Errorf("got %d bytes, the release records %d", n, size)
	}
	if got != want {
		return fmt.Errorf("digest mismatch: the content is %s, the release records %s", got, want)
	}
	return nil
}

func percent(n, total int64) float64 {
	if total <= 0 {
		return -1
	}
	return float64(int64(float64(n)*10000/float64(total))) / 100
}
