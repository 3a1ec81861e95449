package artifacts

import (
	"context"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore"
	"github.com/myriarch/myriarch/internal/fleet/jobs"
	"github.com/myriarch/myriarch/internal/fleet/releases"
)

// download streams one asset into the store and makes it servable only
// once verified.
func (p *Prefetcher) download(ctx context.Context, fence jobs.Fence, w want) (err error) {
	log := p.log.With("package", w.pkg, "version", w.version, "asset", w.Name, "digest", w.Digest)
	if !strings.HasPrefix(w.Digest, "sha256:") {
		p.m.failures.WithLabelValues("digest").Inc()
		return fmt.Errorf("asset %s of %s %s: digest %q: only sha256 is supported", w.Name, w.pkg, w.version, w.Digest)
	}
	c, err := p.claims.claim(ctx, fence, w)
	if err != nil {
		return fmt.Errorf("asset %s of %s %s (%s): claiming the download: %w", w.Name, w.pkg, w.version, w.Digest, err)
	}
	a := &attempt{w: w, c: &c, reason: "source"}
	a.done.Store(c.offset)
	// reset: the bytes written so far are worthless (a digest mismatch).
	reset := false
	defer func() {
		p.m.curBytes.DeleteLabelValues(w.Digest)
		p.m.curTotal.DeleteLabelValues(w.Digest)
		if err == nil || ctx.Err() != nil {
			return
		}
		p.m.failures.WithLabelValues(a.reason).Inc()
		log.Warn("artifact download failed", "bytes", a.done.Load(), "error", err)
		err = fmt.Errorf("asset %s of %s %s (%s): %w", w.Name, w.pkg, w.version, w.Digest, err)
		if ferr := p.failed(ctx, fence, w, c, a.done.Load(), err, reset); ferr != nil {
			err = errors.Join(err, ferr)
		}
	}()
	if err := releases.VerifySignature(w.publicKey, w.Digest, w.Signature); err != nil {
		a.reason, reset = "signature", true
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
		if err := p.claims.checkUpload(ctx, fence, w, &c, log); err != nil {
			a.reason = "store"
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
	} else if src, err = p.fetch.open(ctx, w.Asset, c.offset, c.etag, c.lastMod); err != nil {
		return err
	}
	defer src.body.Close()
	if src.from != c.offset {
		h.Reset()
		log.Info("artifact download starts from byte 0", "committed", c.offset, "size", w.Size)
		if err := p.claims.dropUpload(ctx, fence, w, &c); err != nil {
			a.reason = "store"
			return err
		}
	} else if c.offset > 0 {
		p.m.resumed.Inc()
		log.Info("artifact download resumed", "from", c.offset, "size", w.Size)
	} else {
		log.Info("artifact download started", "size", w.Size, "store", c.store)
	}
	a.done.Store(src.from)
	p.m.curTotal.WithLabelValues(w.Digest).Set(float64(w.Size))
	stopReporter := p.reportProgress(ctx, fence, w, c.term, &a.done, log)
	defer stopReporter()

	var n int64
	var key string
	key, n, err = p.writer(c.store).write(ctx, a, src, h)
	if err != nil {
		// Bytes beyond the recorded size are not worth continuing.
		reset = a.reason == "size"
		return err
	}
	stopReporter()
	if err := verify(h, w.Digest, n, w.Size); err != nil {
		a.reason, reset = "digest", true
		if key != "" && c.uploadID == "" {
			p.s3.discard(ctx, key)
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
		a.reason = "store"
		if err := inTerm(ctx, fence, p.o.LockKey, func(ctx context.Context, tx pgx.Tx, _ int64) error { return owns(ctx, tx, w.Digest, c.term) }); err != nil {
			return err
		}
		if err := p.s3.complete(ctx, &c); err != nil {
			return err
		}
	}
	// The term is checked in the same transaction, right before the row
	// that makes the blob servable. committing: the statements ran and the
	// COMMIT was sent, so an error after it leaves the outcome unknown.
	committing := false
	err = inTerm(ctx, fence, p.o.LockKey, func(ctx context.Context, tx pgx.Tx, term int64) error {
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
		a.reason = "store"
		if key != "" && c.uploadID == "" && !committing {
			// The object of a single PUT has a key of this attempt alone and
			// no row names it: garbage, deleted now (retention would too).
			// The object of a multipart upload is not deleted: its key is
			// the upload's, shared by every term that continued it, and a
			// newer term may have completed it too and registered it (a
			// repeated Complete of a completed upload succeeds on AWS S3).
			// Nor is one whose COMMIT may have succeeded. Retention's sweep
			// removes them once no blob row names them.
			p.s3.discard(ctx, key)
		}
		return err
	}
	p.m.blobs.Inc()
	log.Info("artifact stored", "bytes", n, "store", c.store)
	return nil
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
		p.claims.abortUpload(ctx, blobstore.Upload{Key: c.key, ID: c.uploadID})
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
