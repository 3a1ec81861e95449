package artifacts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore"
	"github.com/myriarch/myriarch/internal/fleet/jobs"
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
// term that fence checked (lockKey is ha.leaderLockKey).
func inTerm(ctx context.Context, fence jobs.Fence, lockKey int64, fn func(ctx context.Context, tx pgx.Tx, term int64) error) error {
	return rollout.InTerm(ctx, fence, lockKey, fn)
}

// claims owns the download rows (artifact_downloads) of the job's term:
// it takes a download for the term, decides whether the bytes a previous
// attempt committed can be continued, and gives up an upload that cannot.
type claims struct {
	lockKey int64
	replica string
	// s3 is the S3 store (nil: none); storeS3 stores new blobs there.
	s3      *blobstore.S3
	storeS3 bool
	log     *slog.Logger
}

// claim takes the download's row for this term. A download whose bytes
// and hash state a previous attempt committed is continued: into
// PostgreSQL, its large object; into S3, its multipart upload (checked
// against the store in download). Otherwise a previous large object is
// unlinked (a previous upload aborted) and a new one created.
func (p claims) claim(ctx context.Context, fence jobs.Fence, w want) (c claim, err error) {
	c.store = blobstore.KindPG
	if p.storeS3 {
		if p.s3 == nil {
			return c, errors.New("storing in S3 needs an S3 store")
		}
		c.store = blobstore.KindS3
	}
	err = inTerm(ctx, fence, p.lockKey, func(ctx context.Context, tx pgx.Tx, term int64) error {
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
			w.Digest, w.pkg, w.version, w.Name, c.offset, w.Size, p.replica, term, c.store, oidArg, c.hash, c.etag, c.lastMod,
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
func (p claims) abortUpload(ctx context.Context, u blobstore.Upload) {
	if p.s3 == nil {
		return
	}
	if err := p.s3.AbortUpload(context.WithoutCancel(ctx), u.Key, u.ID); err != nil && !errors.Is(err, blobstore.ErrNoUpload) {
		p.log.Warn("aborting an S3 multipart upload failed; retention will", "key", u.Key, "upload", u.ID, "error", err)
	}
}

// dropUpload gives up the claim's upload: the download starts again from
// byte 0 in a new upload. The row stops naming the upload first, in a
// transaction that checks under the row lock that the download is still
// this term's; only then is the upload aborted. A claimer that lost its
// term meanwhile (paused between its claim and here) gets the stale-term
// error and leaves alone the upload that the newer term continues.
func (p claims) dropUpload(ctx context.Context, fence jobs.Fence, w want, c *claim) error {
	if c.uploadID != "" {
		err := inTerm(ctx, fence, p.lockKey, func(ctx context.Context, tx pgx.Tx, _ int64) error {
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
func (p claims) checkUpload(ctx context.Context, fence jobs.Fence, w want, c *claim, log *slog.Logger) error {
	if c.uploadID == "" {
		return nil
	}
	why := "no bytes to continue from"
	if c.offset > 0 {
		got, err := p.s3.Parts(ctx, c.key, c.uploadID)
		switch {
		case errors.Is(err, blobstore.ErrNoUpload):
			why = "the store no longer has the upload"
		case blobstore.CannotList(err):
			// A store that cannot list the parts (not every S3-compatible
			// one implements it) still gets the blob, from byte 0.
			why = "the store does not list the parts: " + err.Error()
		case err != nil:
			return fmt.Errorf("listing the parts of upload %s of %s in %s: %w", c.uploadID, c.key, p.s3, err)
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
