// Package artifacts is myriarchd's artifact prefetch (a leader job) and the
// artifact endpoint that every replica serves.
//
// The prefetcher downloads the assets of tracked releases that match the
// platforms of the fleet (the agents' os.type and host.arch attributes;
// assets without a platform always), verifies the sha256 digest and, where
// the package has a public key, the ed25519 signature of the digest, and
// stores each blob once, addressed by its digest, in a blob store that
// every replica serves from (package blobstore): PostgreSQL large objects
// by default, or an S3-compatible store.
//
// A blob is servable only once its artifact_blobs row exists, and that row
// is inserted only after the bytes are completely stored and the digest,
// size and signature check out, in a transaction fenced by the job's term.
// A corrupt or partial blob is therefore never served.
//
// Downloads into PostgreSQL resume: the large object is committed in
// segments (Options.SegmentSize), and each segment records in the
// download's row the bytes written and the serialized sha256 state after
// them. A new leader continues from there with an HTTP Range request when
// the source answers it (206, with the same ETag or Last-Modified as
// before); otherwise it starts again from byte 0. The row names the term
// of the job that owns the download: a segment commits only while the row
// still names that term, checked under a row lock at commit, so the job of
// a leader that lost its term cannot write into a download that a new
// leader took over. Uploads to S3 start again from byte 0 after a failover
// (the unfinished multipart upload is garbage for retention).
//
// Retention: per package, the blobs of the newest keep versions plus those
// of every version that an agent reports in its package statuses are kept;
// other blobs are removed from their store, and so are partial large
// objects and multipart uploads of downloads that are no longer wanted, S3
// objects without a blob row and multipart uploads without a download row.
package artifacts

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore"
	"github.com/myriarch/myriarch/internal/fleet/jobs"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// ChunkSize is the size of one read from the source and one write to the
// store: the prefetcher's memory per download into PostgreSQL (an upload
// to S3 buffers one part, Options.S3PartSize).
const ChunkSize = blobstore.ReadChunk

// DefaultSegmentSize is how many bytes of a download into PostgreSQL are
// committed at once: what a failover can cost again.
const DefaultSegmentSize = 8 << 20

// ProgressEvery is how often a running download's progress is written to
// the database, logged and exported.
const ProgressEvery = time.Second

// S3SweepGrace is the age below which retention's sweep leaves an S3
// object that no blob row names, or a multipart upload that no download
// row names: it may be one that a leader (this one, or one that took over
// while a stale leader sweeps) completed or started and has not recorded
// yet. An hour is far longer than the time between completing an upload
// and registering it, or starting one and recording its first part, and
// than any clock skew between the store and the replicas; the garbage it
// spares is removed by a sweep an hour later.
const S3SweepGrace = time.Hour

// Options configure the prefetcher.
type Options struct {
	Pool *pgxpool.Pool
	// LockKey is ha.leaderLockKey: the term row that the job reads inside
	// its fenced transactions, to record which term wrote what.
	LockKey int64
	Replica string
	// Keep is the number of newest versions per package whose blobs are kept.
	Keep int
	// S3 is the S3-compatible store, if one is configured: retention
	// deletes the objects of S3 blobs through it and sweeps its garbage.
	S3 *blobstore.S3
	// StoreS3 stores new blobs in S3 (which must be set) instead of as
	// PostgreSQL large objects. Blobs already stored stay where they are
	// (and are still served and retained).
	StoreS3 bool
	// SegmentSize overrides DefaultSegmentSize (at least ChunkSize).
	SegmentSize int64
	// S3PartSize overrides blobstore.S3PartSize (at least
	// blobstore.S3MinPartSize, S3's smallest part).
	S3PartSize int64
	Client     *http.Client
	Log        *slog.Logger
	// Registerer may be nil.
	Registerer prometheus.Registerer
	// ProgressEvery overrides ProgressEvery (tests).
	ProgressEvery time.Duration
	// S3SweepGrace overrides S3SweepGrace (tests).
	S3SweepGrace time.Duration
}

// Progress is one download as the API shows it.
type Progress struct {
	Digest    string    `json:"digest"`
	Package   string    `json:"package"`
	Version   string    `json:"version"`
	Asset     string    `json:"asset"`
	State     string    `json:"state"`
	Bytes     int64     `json:"bytes"`
	Total     int64     `json:"total"`
	Percent   float64   `json:"percent"`
	Attempts  int64     `json:"attempts"`
	Error     string    `json:"error"`
	ReplicaID string    `json:"replica_id"`
	UpdatedAt time.Time `json:"updated_at"`
	// Store is where the download goes (pg, s3); ResumedFrom is the byte
	// the latest attempt continued from (0: from the beginning).
	Store       string `json:"store"`
	ResumedFrom int64  `json:"resumed_from"`
}

// Prefetcher is the artifact prefetch job. Its parts each do one thing:
// plan chooses the assets to download (plan.go), fetch opens their
// content with resume (fetch.go), claims owns the download rows of the
// job's term (claim.go), a blobWriter per store streams the content into
// PostgreSQL or S3 (write_pg.go, write_s3.go), download puts them together
// for one asset and makes the verified blob servable (download.go), and
// retention removes what is no longer needed (retain.go).
type Prefetcher struct {
	o   Options
	log *slog.Logger
	m   *metrics

	plan   planner
	fetch  fetcher
	claims claims
	pg     pgWriter
	s3     s3Writer
	retain retainer

	mu sync.Mutex
}

// New returns the prefetcher.
func New(o Options) *Prefetcher {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Client == nil {
		o.Client = http.DefaultClient
	}
	if o.Keep <= 0 {
		o.Keep = 3
	}
	if o.ProgressEvery <= 0 {
		o.ProgressEvery = ProgressEvery
	}
	if o.S3SweepGrace <= 0 {
		o.S3SweepGrace = S3SweepGrace
	}
	if o.SegmentSize < ChunkSize {
		o.SegmentSize = DefaultSegmentSize
	}
	if o.S3PartSize < blobstore.S3MinPartSize {
		o.S3PartSize = blobstore.S3PartSize
	}
	log := o.Log.With("component", "artifact_prefetch")
	m := newMetrics(o.Registerer)
	return &Prefetcher{o: o, log: log, m: m,
		plan:   planner{pool: o.Pool, keep: o.Keep},
		fetch:  fetcher{client: o.Client},
		claims: claims{lockKey: o.LockKey, replica: o.Replica, s3: o.S3, storeS3: o.StoreS3, log: log},
		pg:     pgWriter{pool: o.Pool, segmentSize: o.SegmentSize, m: m},
		s3:     s3Writer{s3: o.S3, pool: o.Pool, partSize: o.S3PartSize, m: m},
		retain: retainer{pool: o.Pool, lockKey: o.LockKey, keep: o.Keep, s3: o.S3, grace: o.S3SweepGrace, log: log, m: m},
	}
}

// writer is the blob writer of store kind (blobstore.KindPG, KindS3).
func (p *Prefetcher) writer(kind string) blobWriter {
	if kind == blobstore.KindS3 {
		return p.s3
	}
	return p.pg
}

// Job returns the leader job.
func (p *Prefetcher) Job(interval time.Duration) jobs.Job {
	return jobs.Job{Name: "artifact_prefetch", Interval: interval, Run: p.Run}
}

// Run downloads every wanted blob that is missing, then applies retention.
// Only one Run works at a time.
func (p *Prefetcher) Run(ctx context.Context, fence jobs.Fence) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	ws, err := p.plan.wanted(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, w := range ws {
		if err := p.download(ctx, fence, w); err != nil {
			if ctx.Err() != nil {
				return err
			}
			errs = append(errs, err)
		}
	}
	if err := p.retain.retain(ctx, fence); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// BlobStored reports whether the blob of digest is stored.
func BlobStored(ctx context.Context, q store.Querier, digest string) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM artifact_blobs WHERE digest = $1)`, digest).Scan(&ok)
	return ok, err
}

// DownloadRecorded reports whether a download of digest is recorded (the
// prefetcher claimed it).
func DownloadRecorded(ctx context.Context, q store.Querier, digest string) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM artifact_downloads WHERE digest = $1)`, digest).Scan(&ok)
	return ok, err
}

// InUse returns the package versions that agents report as installed in
// their package statuses, as keys package + "@" + version.
func InUse(ctx context.Context, pool *pgxpool.Pool) (map[string]bool, error) {
	vs, err := store.InstalledPackageVersions(ctx, pool)
	m := map[string]bool{}
	for _, v := range vs {
		m[v] = true
	}
	return m, err
}

// Downloads returns the recorded downloads, running ones first.
func Downloads(ctx context.Context, pool *pgxpool.Pool) ([]Progress, error) {
	rows, err := pool.Query(ctx, `SELECT digest, package, version, asset, state, bytes, total, attempts, error, replica_id, updated_at, store, resumed_from
		FROM artifact_downloads ORDER BY state = 'downloading' DESC, updated_at DESC`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Progress, error) {
		var d Progress
		err := r.Scan(&d.Digest, &d.Package, &d.Version, &d.Asset, &d.State, &d.Bytes, &d.Total, &d.Attempts, &d.Error, &d.ReplicaID, &d.UpdatedAt, &d.Store, &d.ResumedFrom)
		d.Percent = percent(d.Bytes, d.Total)
		return d, err
	})
}

// Blob is one stored blob.
type Blob struct {
	Digest   string    `json:"digest"`
	Store    string    `json:"store"`
	Size     int64     `json:"size"`
	StoredAt time.Time `json:"stored_at"`
}

// Blobs returns the stored blobs.
func Blobs(ctx context.Context, pool *pgxpool.Pool) ([]Blob, error) {
	rows, err := pool.Query(ctx, `SELECT digest, store, size, stored_at FROM artifact_blobs ORDER BY stored_at DESC`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Blob])
}
