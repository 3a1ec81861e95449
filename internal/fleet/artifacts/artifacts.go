// Package artifacts is myriarchd's artifact prefetch (a leader job) and the
// artifact endpoint that every replica serves.
//
// The prefetcher downloads the assets of tracked releases that match the
// platforms of the fleet (the agents' os.type and host.arch attributes;
// assets without a platform always), verifies the sha256 digest and, where
// the package has a public key, the ed25519 signature of the digest, and
// stores each blob once, addressed by its digest, as a PostgreSQL large
// object that every replica serves from.
//
// A blob is written in one transaction: the large object is created and
// streamed in chunks (never whole in memory) while the digest is computed,
// and only after the digest, size and signature check out does the same
// transaction fence the term and insert the artifact_blobs row that makes
// the blob servable. A leader that dies mid-download leaves nothing: its
// transaction rolls back with the large object, and the new leader starts
// the download again. A corrupt or partial blob is therefore never served.
//
// Retention: per package, the blobs of the newest keep versions plus those
// of every version that an agent reports in its package statuses are kept;
// other blobs are unlinked.
package artifacts

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/myriarch/myriarch/internal/fleet/jobs"
	"github.com/myriarch/myriarch/internal/fleet/releases"
)

// ChunkSize is the size of one read from the source and one write to the
// large object: the prefetcher's memory per download.
const ChunkSize = 256 << 10

// ProgressEvery is how often a running download's progress is written to
// the database, logged and exported.
const ProgressEvery = time.Second

// Options configure the prefetcher.
type Options struct {
	Pool *pgxpool.Pool
	// FenceTx checks the term inside the caller's transaction
	// (pgleader.Elector.Fence); the blob row is inserted after it.
	FenceTx func(ctx context.Context, tx pgx.Tx) error
	// TermOf returns the current term, for the records.
	TermOf  func() int64
	Replica string
	// Keep is the number of newest versions per package whose blobs are kept.
	Keep   int
	Client *http.Client
	Log    *slog.Logger
	// Registerer may be nil.
	Registerer prometheus.Registerer
	// ProgressEvery overrides ProgressEvery (tests).
	ProgressEvery time.Duration
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
}

// Prefetcher is the artifact prefetch job.
type Prefetcher struct {
	o   Options
	log *slog.Logger

	mBytes    prometheus.Counter
	mBlobs    prometheus.Counter
	mFailures *prometheus.CounterVec
	mCurBytes *prometheus.GaugeVec
	mCurTotal *prometheus.GaugeVec
	mUnlinked prometheus.Counter

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
	if o.TermOf == nil {
		o.TermOf = func() int64 { return 0 }
	}
	p := &Prefetcher{o: o, log: o.Log.With("component", "artifact_prefetch"),
		mBytes:    prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_artifact_download_bytes_total", Help: "Bytes downloaded by the artifact prefetcher."}),
		mBlobs:    prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_artifact_blobs_stored_total", Help: "Verified blobs stored by the artifact prefetcher."}),
		mFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "myriarch_artifact_download_failures_total", Help: "Failed artifact downloads by reason."}, []string{"reason"}),
		mCurBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "myriarch_artifact_download_progress_bytes", Help: "Bytes downloaded so far of a running download."}, []string{"digest"}),
		mCurTotal: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "myriarch_artifact_download_size_bytes", Help: "Size of a running download (-1 unknown)."}, []string{"digest"}),
		mUnlinked: prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_artifact_blobs_removed_total", Help: "Blobs removed by the retention of the artifact prefetcher."}),
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(p.mBytes, p.mBlobs, p.mFailures, p.mCurBytes, p.mCurTotal, p.mUnlinked)
	}
	return p
}

// Job returns the leader job.
func (p *Prefetcher) Job(interval time.Duration) jobs.Job {
	return jobs.Job{Name: "artifact_prefetch", Interval: interval, Run: p.Run}
}

type want struct {
	releases.Asset
	pkg, version, publicKey string
}

// Run downloads every wanted blob that is missing, then applies retention.
// Only one Run works at a time.
func (p *Prefetcher) Run(ctx context.Context, fence jobs.Fence) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	ws, err := p.wanted(ctx)
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
	if err := p.retain(ctx, fence); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// wanted lists the assets of the newest Keep versions of every package that
// match a platform of the fleet and have no blob yet, newest first.
func (p *Prefetcher) wanted(ctx context.Context) ([]want, error) {
	rels, err := releases.ListReleases(ctx, p.o.Pool, "")
	if err != nil {
		return nil, err
	}
	srcs, err := releases.ListSources(ctx, p.o.Pool)
	if err != nil {
		return nil, err
	}
	keys := map[string]string{}
	for _, s := range srcs {
		keys[s.Name] = s.PublicKey
	}
	plat, err := p.platforms(ctx)
	if err != nil {
		return nil, err
	}
	have, err := p.haveBlobs(ctx)
	if err != nil {
		return nil, err
	}
	var out []want
	seen := map[string]bool{}
	n := map[string]int{}
	for _, r := range rels { // newest first within a package
		if n[r.Package] >= p.o.Keep {
			continue
		}
		n[r.Package]++
		for _, a := range r.Assets {
			if have[a.Digest] || seen[a.Digest] {
				continue
			}
			if a.OS != "" && !plat[a.OS+"/"+a.Arch] {
				continue
			}
			seen[a.Digest] = true
			out = append(out, want{Asset: a, pkg: r.Package, version: r.Version, publicKey: keys[r.Package]})
		}
	}
	return out, nil
}

// platforms returns the "os/arch" pairs that the fleet's agents report.
func (p *Prefetcher) platforms(ctx context.Context) (map[string]bool, error) {
	rows, err := p.o.Pool.Query(ctx, `SELECT DISTINCT lower(attrs->>'os.type') || '/' || lower(coalesce(attrs->>'host.arch', ''))
		FROM agents WHERE attrs ? 'os.type'`)
	if err != nil {
		return nil, err
	}
	ps, err := pgx.CollectRows(rows, pgx.RowTo[string])
	m := map[string]bool{}
	for _, s := range ps {
		m[s] = true
	}
	return m, err
}

func (p *Prefetcher) haveBlobs(ctx context.Context) (map[string]bool, error) {
	rows, err := p.o.Pool.Query(ctx, `SELECT digest FROM artifact_blobs`)
	if err != nil {
		return nil, err
	}
	ds, err := pgx.CollectRows(rows, pgx.RowTo[string])
	m := map[string]bool{}
	for _, d := range ds {
		m[d] = true
	}
	return m, err
}

// open returns the asset's content stream.
func (p *Prefetcher) open(ctx context.Context, a releases.Asset) (io.ReadCloser, error) {
	// OCI assets are addressed as repository@digest; others are plain URLs.
	if !strings.Contains(a.URL, "@sha256:") {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.URL, nil)
		if err != nil {
			return nil, err
		}
		resp, err := p.o.Client.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return nil, fmt.Errorf("GET %s: %s", a.URL, resp.Status)
		}
		return resp.Body, nil
	}
	return releases.OpenOCI(ctx, p.o.Client, a.URL, a.Size)
}

func (p *Prefetcher) setProgress(ctx context.Context, fence jobs.Fence, w want, state string, n int64, attempt bool, msg string) error {
	return fence(ctx, func(ctx context.Context, tx pgx.Tx) error {
		inc := 0
		if attempt {
			inc = 1
		}
		_, err := tx.Exec(ctx, `INSERT INTO artifact_downloads (digest, package, version, asset, state, bytes, total, attempts, error, replica_id, term, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, now())
			ON CONFLICT (digest) DO UPDATE SET package = $2, version = $3, asset = $4, state = $5, bytes = $6, total = $7,
				attempts = artifact_downloads.attempts + $8, error = $9, replica_id = $10, term = $11, updated_at = now()`,
			w.Digest, w.pkg, w.version, w.Name, state, n, w.Size, inc, msg, p.o.Replica, p.o.TermOf())
		return err
	})
}

// download streams one asset into a large object and makes it servable
// only once verified.
func (p *Prefetcher) download(ctx context.Context, fence jobs.Fence, w want) (err error) {
	log := p.log.With("package", w.pkg, "version", w.version, "asset", w.Name, "digest", w.Digest)
	if err := p.setProgress(ctx, fence, w, "downloading", 0, true, ""); err != nil {
		return err
	}
	var n int64
	reason := "source"
	defer func() {
		p.mCurBytes.DeleteLabelValues(w.Digest)
		p.mCurTotal.DeleteLabelValues(w.Digest)
		if err == nil || ctx.Err() != nil {
			return
		}
		p.mFailures.WithLabelValues(reason).Inc()
		log.Warn("artifact download failed", "bytes", n, "error", err)
		err = fmt.Errorf("asset %s of %s %s (%s): %w", w.Name, w.pkg, w.version, w.Digest, err)
		if perr := p.setProgress(ctx, fence, w, "failed", n, false, err.Error()); perr != nil {
			err = errors.Join(err, perr)
		}
	}()
	if !strings.HasPrefix(w.Digest, "sha256:") {
		reason = "digest"
		return fmt.Errorf("digest %q: only sha256 is supported", w.Digest)
	}
	if err := releases.VerifySignature(w.publicKey, w.Digest, w.Signature); err != nil {
		reason = "signature"
		return err
	}
	log.Info("artifact download started", "size", w.Size)
	rc, err := p.open(ctx, w.Asset)
	if err != nil {
		return err
	}
	defer rc.Close()

	tx, err := p.o.Pool.Begin(ctx)
	if err != nil {
		reason = "store"
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	los := tx.LargeObjects()
	oid, err := los.Create(ctx, 0)
	if err != nil {
		reason = "store"
		return err
	}
	obj, err := los.Open(ctx, oid, pgx.LargeObjectModeWrite)
	if err != nil {
		reason = "store"
		return err
	}
	h := sha256.New()
	buf := make([]byte, ChunkSize)
	p.mCurTotal.WithLabelValues(w.Digest).Set(float64(w.Size))
	// The progress is reported on a timer, so a stalled source shows as
	// bytes that stop growing rather than as no report at all.
	var done atomic.Int64
	reporter := make(chan struct{})
	stopReport := make(chan struct{})
	go func() {
		defer close(reporter)
		t := time.NewTicker(p.o.ProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-stopReport:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				k := done.Load()
				log.Info("artifact download progress", "bytes", k, "size", w.Size, "percent", percent(k, w.Size))
				_ = p.setProgress(ctx, fence, w, "downloading", k, false, "")
			}
		}
	}()
	var stopOnce sync.Once
	stopReporter := func() { stopOnce.Do(func() { close(stopReport); <-reporter }) }
	defer stopReporter()
	for {
		k, rerr := io.ReadFull(rc, buf)
		if k > 0 {
			h.Write(buf[:k])
			if _, err := obj.Write(buf[:k]); err != nil {
				reason = "store"
				return err
			}
			n += int64(k)
			done.Store(n)
			p.mBytes.Add(float64(k))
			p.mCurBytes.WithLabelValues(w.Digest).Set(float64(n))
			if w.Size >= 0 && n > w.Size {
				reason = "size"
				return fmt.Errorf("more than the recorded size of %d bytes", w.Size)
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	stopReporter()
	if err := verify(h, w.Digest, n, w.Size); err != nil {
		reason = "digest"
		return err
	}
	if err := obj.Close(); err != nil {
		reason = "store"
		return err
	}
	// The term is checked in the same transaction, right before the row
	// that makes the blob servable.
	if err := p.o.FenceTx(ctx, tx); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO artifact_blobs (digest, store, lo_oid, size, term) VALUES ($1, 'pg', $2, $3, $4)`,
		w.Digest, oid, n, p.o.TermOf()); err != nil {
		reason = "store"
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE artifact_downloads SET state = 'done', bytes = $2, error = '', updated_at = now() WHERE digest = $1`, w.Digest, n); err != nil {
		reason = "store"
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		reason = "store"
		return err
	}
	p.mBlobs.Inc()
	log.Info("artifact stored", "bytes", n)
	return nil
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

// retain unlinks the blobs that no longer belong to the newest Keep
// versions of a package and that no agent reports as its package hash.
func (p *Prefetcher) retain(ctx context.Context, fence jobs.Fence) error {
	rels, err := releases.ListReleases(ctx, p.o.Pool, "")
	if err != nil {
		return err
	}
	inUse, err := InUse(ctx, p.o.Pool)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	n := map[string]int{}
	for _, r := range rels {
		newest := n[r.Package] < p.o.Keep
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
	var removed int64
	err = fence(ctx, func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `DELETE FROM artifact_blobs WHERE NOT (digest = ANY($1)) RETURNING lo_oid`, ks)
		if err != nil {
			return err
		}
		oids, err := pgx.CollectRows(rows, pgx.RowTo[*uint32])
		if err != nil {
			return err
		}
		for _, o := range oids {
			if o == nil {
				continue
			}
			los := tx.LargeObjects()
			if err := los.Unlink(ctx, *o); err != nil {
				return err
			}
			removed++
		}
		return nil
	})
	if err == nil && removed > 0 {
		p.mUnlinked.Add(float64(removed))
		p.log.Info("artifact retention removed blobs", "count", removed)
	}
	return err
}

// InUse returns the package versions that agents report as installed in
// their package statuses, as keys package + "@" + version.
func InUse(ctx context.Context, pool *pgxpool.Pool) (map[string]bool, error) {
	// package_statuses is stored by the OpAMP server as
	// {"packages": {"<name>": {"agent_has_version": "...", ...}}, "error": ""}.
	rows, err := pool.Query(ctx, `SELECT DISTINCT p.k || '@' || (p.s->>'agent_has_version')
		FROM agents, jsonb_each(coalesce(package_statuses->'packages', '{}')) AS p(k, s)
		WHERE coalesce(p.s->>'agent_has_version', '') <> ''`)
	if err != nil {
		return nil, err
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	m := map[string]bool{}
	for _, v := range vs {
		m[v] = true
	}
	return m, err
}

// Downloads returns the recorded downloads, running ones first.
func Downloads(ctx context.Context, pool *pgxpool.Pool) ([]Progress, error) {
	rows, err := pool.Query(ctx, `SELECT digest, package, version, asset, state, bytes, total, attempts, error, replica_id, updated_at
		FROM artifact_downloads ORDER BY state = 'downloading' DESC, updated_at DESC`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Progress, error) {
		var d Progress
		err := r.Scan(&d.Digest, &d.Package, &d.Version, &d.Asset, &d.State, &d.Bytes, &d.Total, &d.Attempts, &d.Error, &d.ReplicaID, &d.UpdatedAt)
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
