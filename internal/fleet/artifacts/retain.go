package artifacts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore"
	"github.com/myriarch/myriarch/internal/fleet/jobs"
	"github.com/myriarch/myriarch/internal/fleet/releases"
)

// retainer applies retention: it removes what the fleet no longer needs
// from the blob stores, and sweeps an S3 store's garbage.
type retainer struct {
	pool    *pgxpool.Pool
	lockKey int64
	// keep is the number of newest versions per package whose blobs are kept.
	keep int
	// s3 is the S3 store (nil: none); grace is its sweep's (Options.S3SweepGrace).
	s3    *blobstore.S3
	grace time.Duration
	log   *slog.Logger
	m     *metrics
}

// retain removes the blobs that no longer belong to the newest keep
// versions of a package and that no agent reports as its package hash,
// the partial large objects of downloads that are no longer wanted, and
// the S3 objects that no blob row names.
func (p retainer) retain(ctx context.Context, fence jobs.Fence) error {
	rels, err := releases.ListReleases(ctx, p.pool, "")
	if err != nil {
		return err
	}
	inUse, err := InUse(ctx, p.pool)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	n := map[string]int{}
	for _, r := range rels {
		newest := n[r.Package] < p.keep
		n[r.Package]++
		if !newest && !inUse[r.Package+"@"+r.Version] {
			continue
		}
		for _, a := range r.Assets {
			keep[a.Digest] = true
		}
	}
	ks := []string{}
	for d := range keep {
		ks = append(ks, d)
	}
	var removed, partial int64
	var objects []blobstore.Ref
	var uploads []blobstore.Upload
	err = inTerm(ctx, fence, p.lockKey, func(ctx context.Context, tx pgx.Tx, term int64) error {
		removed, partial, objects, uploads = 0, 0, nil, nil
		// Without an S3 store the rows of S3 blobs stay: deleting them would
		// leave their objects behind for good.
		rows, err := tx.Query(ctx, `DELETE FROM artifact_blobs WHERE NOT (digest = ANY($1)) AND (store <> 's3' OR $2)
			RETURNING store, lo_oid, object_key, size`, ks, p.s3 != nil)
		if err != nil {
			return err
		}
		refs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (blobstore.Ref, error) {
			var b blobstore.Ref
			var oid *uint32
			var key *string
			err := r.Scan(&b.Kind, &oid, &key, &b.Size)
			if oid != nil {
				b.OID = *oid
			}
			if key != nil {
				b.Key = *key
			}
			return b, err
		})
		if err != nil {
			return err
		}
		pg := blobstore.PG{Pool: p.pool}
		for _, b := range refs {
			removed++
			if b.Kind == blobstore.KindPG {
				if err := pg.Remove(ctx, tx, b); err != nil {
					return err
				}
				continue
			}
			// Deleted once the row is gone for good (after the commit).
			objects = append(objects, b)
		}
		// Partial large objects of downloads that are no longer wanted
		// (the release was dropped, or its version left the newest keep).
		// This job's own downloads of the run are over; a row still
		// "downloading" is of an attempt that died or lost its term, and
		// taking the row for this term stops such a writer's next commit.
		rows, err = tx.Query(ctx, `WITH old AS (SELECT digest, lo_oid, s3_key, s3_upload_id FROM artifact_downloads
				WHERE (lo_oid IS NOT NULL OR s3_upload_id IS NOT NULL) AND NOT (digest = ANY($1)) FOR UPDATE)
			UPDATE artifact_downloads d SET lo_oid = NULL, written = 0, hash_state = NULL, s3_key = NULL, s3_upload_id = NULL, s3_parts = NULL, term = $2,
				state = CASE WHEN d.state = 'downloading' THEN 'failed' ELSE d.state END,
				error = CASE WHEN d.state = 'downloading' THEN 'abandoned: the release is no longer wanted' ELSE d.error END, updated_at = now()
			FROM old WHERE d.digest = old.digest RETURNING old.lo_oid, old.s3_key, old.s3_upload_id`, ks, term)
		if err != nil {
			return err
		}
		var oids []uint32
		var oid *uint32
		var key, upload *string
		if _, err := pgx.ForEachRow(rows, []any{&oid, &key, &upload}, func() error {
			if oid != nil {
				oids = append(oids, *oid)
			}
			if key != nil && upload != nil && *upload != "" {
				uploads = append(uploads, blobstore.Upload{Key: *key, ID: *upload})
			}
			return nil
		}); err != nil {
			return err
		}
		for _, o := range oids {
			var exists bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_largeobject_metadata WHERE oid = $1)`, o).Scan(&exists); err != nil {
				return err
			}
			if exists {
				los := tx.LargeObjects()
				if err := los.Unlink(ctx, o); err != nil {
					return err
				}
				partial++
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	var errs []error
	if p.s3 != nil {
		for _, b := range objects {
			if err := p.s3.Remove(ctx, nil, b); err != nil {
				errs = append(errs, fmt.Errorf("retention: deleting %s from %s: %w", b.Key, p.s3, err))
			}
		}
		for _, u := range uploads {
			if err := p.s3.AbortUpload(ctx, u.Key, u.ID); err != nil && !errors.Is(err, blobstore.ErrNoUpload) {
				errs = append(errs, fmt.Errorf("retention: aborting upload %s of %s in %s: %w", u.ID, u.Key, p.s3, err))
				continue
			}
			partial++
		}
		if err := p.sweepS3(ctx, fence); err != nil {
			errs = append(errs, err)
		}
	}
	if removed > 0 || partial > 0 {
		p.m.unlinked.Add(float64(removed))
		p.log.Info("artifact retention removed blobs", "count", removed, "partial_downloads", partial)
	}
	return errors.Join(errs...)
}

// sweepS3 deletes the objects under the prefix that no blob row names
// (uploads of a leader that lost its term, corrupt uploads whose deletion
// failed, objects whose row retention removed) and aborts the unfinished
// multipart uploads that no download row names (a leader that died before
// it recorded the first part, an upload given up whose abort failed). The
// uploads that download rows name are kept for a resume. Only the leader's
// job runs it, after its own downloads of the run, so no upload of this
// job is in progress; but a leader may lose its term during the sweep, and
// a newer one complete an upload it has not registered yet, or start one
// whose first part it has not recorded: objects and uploads younger than
// the grace (grace, Options.S3SweepGrace, by the store's LastModified and
// Initiated) are left for a later sweep.
//
// It also heals the opposite: a blob row, older than the grace, whose
// object the listing lacks (deleted by hand or by a lifecycle rule) is
// deleted in a fenced transaction, so the next run downloads the blob
// again instead of serving a missing object for good. The listing is made
// before the rows are read, so a row that old named an object that
// existed before the listing began.
func (p retainer) sweepS3(ctx context.Context, fence jobs.Fence) error {
	objects, incomplete, err := p.s3.Objects(ctx)
	if err != nil {
		return fmt.Errorf("retention: listing %s: %w", p.s3, err)
	}
	rows, err := p.pool.Query(ctx, `SELECT digest, object_key, stored_at < now() - make_interval(secs => $1) FROM artifact_blobs WHERE object_key IS NOT NULL`,
		p.grace.Seconds())
	if err != nil {
		return err
	}
	live := map[string]bool{}
	type named struct {
		digest, key string
	}
	var old []named
	var digest, key string
	var isOld bool
	if _, err := pgx.ForEachRow(rows, []any{&digest, &key, &isOld}, func() error {
		live[key] = true
		if isOld {
			old = append(old, named{digest, key})
		}
		return nil
	}); err != nil {
		return err
	}
	listed := make(map[string]bool, len(objects))
	for _, o := range objects {
		listed[o.Key] = true
	}
	var errs []error
	for _, b := range old {
		if listed[b.key] {
			continue
		}
		err := inTerm(ctx, fence, p.lockKey, func(ctx context.Context, tx pgx.Tx, _ int64) error {
			_, err := tx.Exec(ctx, `DELETE FROM artifact_blobs WHERE digest = $1 AND object_key = $2`, b.digest, b.key)
			return err
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("retention: forgetting blob %s, whose object %s is missing from %s: %w", b.digest, b.key, p.s3, err))
			continue
		}
		p.log.Warn("artifact blob's S3 object is missing; forgot the blob, the next run downloads it again", "digest", b.digest, "key", b.key, "store", p.s3.String())
	}
	young := func(t time.Time) bool { return time.Since(t) < p.grace }
	var n int
	for _, o := range objects {
		if live[o.Key] || young(o.Modified) {
			continue
		}
		if err := p.s3.Delete(ctx, o.Key); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	rows, err = p.pool.Query(ctx, `SELECT s3_upload_id FROM artifact_downloads WHERE s3_upload_id IS NOT NULL`)
	if err != nil {
		return err
	}
	resumable, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, id := range resumable {
		keep[id] = true
	}
	for _, u := range incomplete {
		if keep[u.ID] || young(u.Initiated) {
			continue
		}
		if err := p.s3.AbortUpload(ctx, u.Key, u.ID); err != nil && !errors.Is(err, blobstore.ErrNoUpload) {
			errs = append(errs, err)
		}
	}
	if n > 0 {
		p.m.unlinked.Add(float64(n))
		p.log.Info("artifact retention removed S3 objects without a blob row", "count", n, "store", p.s3.String())
	}
	return errors.Join(errs...)
}
