package artifacts_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/fleet/artifacts"
	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/releases"
	"github.com/myriarch/myriarch/internal/fleet/releases/ocitest"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/pgleader"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

type env struct {
	st          *store.Store
	el          *pgleader.Leadership
	term        int64
	stopElector func()
}

func leader(t *testing.T) env {
	t.Helper()
	pg := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	st, err := store.Open(ctx, pg.DSN(""), 8, nil)
	if err != nil {
		t.Fatal(err)
	}
	el, stopElector, err := fleettest.Elect(st.Pool, "r1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); stopElector(); st.Close() })
	term := el.Term()
	return env{st, el, term, stopElector}
}

// nextTerm ends the current leader's election and elects a new leader,
// whose term is newer: the leadership of a failover.
func (e env) nextTerm(t *testing.T) *pgleader.Leadership {
	t.Helper()
	e.stopElector()
	cur, stop, err := fleettest.Elect(e.st.Pool, "r1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return cur
}

func (e env) prefetcher(keep int) *artifacts.Prefetcher {
	return e.prefetcherWith(artifacts.Options{Keep: keep})
}

func (e env) prefetcherWith(o artifacts.Options) *artifacts.Prefetcher {
	o.Pool, o.LockKey, o.Replica, o.ProgressEvery = e.st.Pool, pgleader.DefaultLockKey, "r1", 20*time.Millisecond
	return artifacts.New(o)
}

// serve fetches a blob from the artifact endpoint.
func serve(t *testing.T, e env, digest string, stores ...blobstore.Store) []byte {
	t.Helper()
	srv := httptest.NewServer(artifacts.Handler(e.st.Pool, func(*http.Request) error { return nil }, nil, stores...))
	defer srv.Close()
	resp, err := http.Get(srv.URL + artifacts.PathPrefix + digest)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", digest, resp.StatusCode, b)
	}
	return b
}

// counter finds a registered metric.
func counter(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: "copy"}, func() float64 {
				var v float64
				for _, m := range mf.GetMetric() {
					v += m.GetCounter().GetValue()
				}
				return v
			})
		}
	}
	t.Fatalf("metric %s not registered", name)
	return nil
}

func agent(t *testing.T, pool *pgxpool.Pool, uid, os, arch string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `INSERT INTO agents (instance_uid, attrs) VALUES ($1, jsonb_build_object('os.type', $2::text, 'host.arch', $3::text))`, uid, os, arch); err != nil {
		t.Fatal(err)
	}
}

// release records a release whose assets are plain HTTP URLs (as GitHub
// Releases assets are).
func release(t *testing.T, pool *pgxpool.Pool, pkg, version string, assets ...releases.Asset) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO package_sources (name, type, source, poll_interval_ms) VALUES ($1, 'github', 'o/r', 60000) ON CONFLICT DO NOTHING`, pkg); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO package_releases (package, version, published_at, term) VALUES ($1, $2, now(), 1)`, pkg, version); err != nil {
		t.Fatal(err)
	}
	for _, a := range assets {
		if _, err := pool.Exec(ctx, `INSERT INTO package_assets (package, version, name, os, arch, digest, size, url, signature) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			pkg, version, a.Name, a.OS, a.Arch, a.Digest, a.Size, a.URL, a.Signature); err != nil {
			t.Fatal(err)
		}
	}
}

func largeObjects(t *testing.T, pool *pgxpool.Pool) int {
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_largeobject_metadata`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestRegistryReleaseIsPrefetchedForTheFleetsPlatformsAndServed(t *testing.T) {
	reg := ocitest.Start(t)
	e := leader(t)
	ctx := context.Background()
	amd := bytes.Repeat([]byte("amd64-"), 200_000) // 1.2 MB: several chunks
	arm := []byte("arm64 build")
	win := []byte("windows build")
	if err := reg.Push(ctx, "agents/otelcol", "v1.0.0", []ocitest.File{
		{Name: "otelcol_linux_amd64.tar.gz", Data: amd}, {Name: "otelcol_linux_arm64.tar.gz", Data: arm}, {Name: "otelcol_windows_amd64.zip", Data: win}}); err != nil {
		t.Fatal(err)
	}
	if err := releases.PutSource(ctx, e.st.Pool, releases.Source{Name: "otelcol", Type: "oci", Source: reg.Repo("agents/otelcol"), PollInterval: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := releases.NewTracker(e.st.Pool, map[string]releases.Lister{"oci": releases.OCILister{}}, pgleader.DefaultLockKey, nil, nil).Run(ctx, e.el.InTerm); err != nil {
		t.Fatal(err)
	}
	agent(t, e.st.Pool, "a1", "linux", "amd64")
	agent(t, e.st.Pool, "a2", "linux", "arm64")
	if err := e.prefetcher(3).Run(ctx, e.el.InTerm); err != nil {
		t.Fatal(err)
	}
	blobs, _ := artifacts.Blobs(ctx, e.st.Pool)
	got := map[string]int64{}
	for _, b := range blobs {
		got[b.Digest] = b.Size
	}
	if len(got) != 2 || got[digestOf(amd)] != int64(len(amd)) || got[digestOf(arm)] != int64(len(arm)) {
		t.Fatalf("blobs: %+v (windows must not be fetched: no windows agent)", blobs)
	}
	dls, _ := artifacts.Downloads(ctx, e.st.Pool)
	for _, d := range dls {
		if d.State != "done" || d.Percent != 100 {
			t.Fatalf("download: %+v", d)
		}
	}

	srv := httptest.NewServer(http.StripPrefix("", artifacts.Handler(e.st.Pool, secretAuth("agent-secret-0123456789"), nil)))
	defer srv.Close()
	get := func(auth, path string, hdr ...string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	path := artifacts.PathPrefix + digestOf(amd)
	if r, _ := get("", path); r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("without credential: %d", r.StatusCode)
	}
	if r, _ := get("wrong", path); r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong credential: %d", r.StatusCode)
	}
	r, body := get("agent-secret-0123456789", path)
	if r.StatusCode != 200 || !bytes.Equal(body, amd) || r.Header.Get("ETag") != `"`+digestOf(amd)+`"` {
		t.Fatalf("full: %d, %d bytes, etag %q", r.StatusCode, len(body), r.Header.Get("ETag"))
	}
	r, body = get("agent-secret-0123456789", path, "Range", "bytes=600000-600011")
	if r.StatusCode != http.StatusPartialContent || !bytes.Equal(body, amd[600000:600012]) {
		t.Fatalf("range: %d %q", r.StatusCode, body)
	}
	if r, _ = get("agent-secret-0123456789", path, "If-None-Match", `"`+digestOf(amd)+`"`); r.StatusCode != http.StatusNotModified {
		t.Fatalf("if-none-match: %d", r.StatusCode)
	}
	if r, _ = get("agent-secret-0123456789", artifacts.PathPrefix+digestOf(win)); r.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown blob: %d", r.StatusCode)
	}
}

func TestCorruptOrBadlySignedDownloadIsNeverStored(t *testing.T) {
	e := leader(t)
	ctx := context.Background()
	good := []byte("the real agent")
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("tampered agent")) }))
	defer src.Close()
	pub, priv, _ := ed25519.GenerateKey(nil)
	release(t, e.st.Pool, "agent", "v1.0.0", releases.Asset{Name: "agent", Digest: digestOf(good), Size: -1, URL: src.URL + "/agent"})
	if err := e.prefetcher(3).Run(ctx, e.el.InTerm); err == nil || !strings.Contains(err.Error(), "digest mismatch") {
		t.Fatalf("want a digest mismatch, got %v", err)
	}
	if b, _ := artifacts.Blobs(ctx, e.st.Pool); len(b) != 0 || largeObjects(t, e.st.Pool) != 0 {
		t.Fatalf("a corrupt blob was kept: %+v", b)
	}
	dls, _ := artifacts.Downloads(ctx, e.st.Pool)
	if len(dls) != 1 || dls[0].State != "failed" || !strings.Contains(dls[0].Error, "digest mismatch") || dls[0].Attempts != 1 {
		t.Fatalf("download record: %+v", dls)
	}

	// A signed package: a wrong signature is refused before downloading.
	if _, err := e.st.Pool.Exec(ctx, `UPDATE package_sources SET public_key = $1`, base64.StdEncoding.EncodeToString(pub)); err != nil {
		t.Fatal(err)
	}
	other := []byte("other")
	if _, err := e.st.Pool.Exec(ctx, `UPDATE package_assets SET signature = $1`, base64.StdEncoding.EncodeToString(ed25519.Sign(priv, []byte(digestOf(other))))); err != nil {
		t.Fatal(err)
	}
	if err := e.prefetcher(3).Run(ctx, e.el.InTerm); err == nil || !strings.Contains(err.Error(), "signature") {
		t.Fatalf("want a signature error, got %v", err)
	}
}

// slowSource serves data with Range and ETag support; the first request
// pauses after half of the data until released. It records the Range
// header and the bytes it sent of every request.
type slowSource struct {
	data    []byte
	etag    atomic.Value // string
	release chan struct{}
	first   atomic.Bool
	mu      sync.Mutex
	ranges  []string
	sent    []int64
}

func newSlowSource(data []byte) *slowSource {
	s := &slowSource{data: data, release: make(chan struct{})}
	s.etag.Store(`"v1"`)
	return s
}

func (s *slowSource) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	i := len(s.ranges)
	s.ranges = append(s.ranges, r.Header.Get("Range"))
	s.sent = append(s.sent, 0)
	s.mu.Unlock()
	count := func(b []byte) {
		n, _ := w.Write(b)
		s.mu.Lock()
		s.sent[i] += int64(n)
		s.mu.Unlock()
	}
	etag := s.etag.Load().(string)
	w.Header().Set("ETag", etag)
	w.Header().Set("Accept-Ranges", "bytes")
	from := 0
	if rg, ok := strings.CutPrefix(r.Header.Get("Range"), "bytes="); ok && strings.HasSuffix(rg, "-") &&
		(r.Header.Get("If-Range") == "" || r.Header.Get("If-Range") == etag) {
		from, _ = strconv.Atoi(strings.TrimSuffix(rg, "-"))
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", from, len(s.data)-1, len(s.data)))
		w.Header().Set("Content-Length", fmt.Sprint(len(s.data)-from))
		w.WriteHeader(http.StatusPartialContent)
	} else {
		w.Header().Set("Content-Length", fmt.Sprint(len(s.data)))
	}
	body := s.data[from:]
	if s.first.CompareAndSwap(false, true) {
		half := len(body) / 2
		count(body[:half])
		w.(http.Flusher).Flush()
		select {
		case <-s.release:
		case <-r.Context().Done():
			return
		}
		body = body[half:]
	}
	count(body)
}

func (s *slowSource) requests() ([]string, []int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ranges), slices.Clone(s.sent)
}

// interrupt starts a download from src, waits until at least half of it is
// committed, ends the leadership of the run and checks that nothing is
// servable.
func interrupt(t *testing.T, e env, p *artifacts.Prefetcher, size int) {
	t.Helper()
	interruptAt(t, e, p, int64(size/2)-artifacts.ChunkSize)
}

// interruptAt is interrupt once at least committed bytes are committed.
func interruptAt(t *testing.T, e env, p *artifacts.Prefetcher, committed int64) {
	t.Helper()
	ctx := context.Background()
	lctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(lctx, e.el.InTerm) }()
	// Mid-download: the progress is visible to every replica.
	if !fleettest.Eventually(30*time.Second, func() bool {
		var written int64
		_ = e.st.Pool.QueryRow(ctx, `SELECT written FROM artifact_downloads`).Scan(&written)
		dls, _ := artifacts.Downloads(ctx, e.st.Pool)
		return len(dls) == 1 && dls[0].State == "downloading" && written >= committed && dls[0].Percent > 0
	}) {
		t.Fatal("no progress committed mid-download")
	}
	stop() // leadership ends
	if err := <-done; err == nil {
		t.Fatal("interrupted run reported success")
	}
	if b, _ := artifacts.Blobs(ctx, e.st.Pool); len(b) != 0 {
		t.Fatalf("a partial blob is servable: %+v", b)
	}
}

func TestDownloadInterruptedByLossOfLeadershipResumesWithARangeRequest(t *testing.T) {
	e := leader(t)
	ctx := context.Background()
	data := bytes.Repeat([]byte("0123456789abcdef"), 256<<10) // 4 MiB
	slow := newSlowSource(data)
	src := httptest.NewServer(slow)
	defer src.Close()
	release(t, e.st.Pool, "agent", "v1.0.0", releases.Asset{Name: "agent", Digest: digestOf(data), Size: int64(len(data)), URL: src.URL + "/agent"})

	reg := prometheus.NewRegistry()
	interrupt(t, e, e.prefetcherWith(artifacts.Options{Keep: 3, SegmentSize: artifacts.ChunkSize}), len(data))
	var written int64
	if err := e.st.Pool.QueryRow(ctx, `SELECT written FROM artifact_downloads`).Scan(&written); err != nil || written <= 0 {
		t.Fatalf("nothing committed to resume from: %d %v", written, err)
	}
	if n := largeObjects(t, e.st.Pool); n != 1 {
		t.Fatalf("large objects after the interruption: %d, want the partial one", n)
	}

	// The next leader continues from the committed bytes.
	if err := e.prefetcherWith(artifacts.Options{Keep: 3, SegmentSize: artifacts.ChunkSize, Registerer: reg}).Run(ctx, e.el.InTerm); err != nil {
		t.Fatal(err)
	}
	ranges, sent := slow.requests()
	if len(ranges) != 2 || ranges[1] != fmt.Sprintf("bytes=%d-", written) || sent[1] != int64(len(data))-written {
		t.Fatalf("requests to the source: ranges %q, bytes sent %v; want the second from byte %d", ranges, sent, written)
	}
	if got := testutil.ToFloat64(counter(t, reg, "myriarch_artifact_downloads_resumed_total")); got != 1 {
		t.Fatalf("resumed counter %v", got)
	}
	b, _ := artifacts.Blobs(ctx, e.st.Pool)
	if len(b) != 1 || b[0].Size != int64(len(data)) || largeObjects(t, e.st.Pool) != 1 {
		t.Fatalf("blobs after the resume: %+v", b)
	}
	if got := serve(t, e, digestOf(data)); !bytes.Equal(got, data) {
		t.Fatalf("served %d bytes that differ from the source", len(got))
	}
	dls, _ := artifacts.Downloads(ctx, e.st.Pool)
	if dls[0].State != "done" || dls[0].Attempts != 2 || dls[0].ResumedFrom != written || dls[0].Store != "pg" {
		t.Fatalf("download record: %+v", dls[0])
	}
}

func TestResumeStartsAgainWhenTheSourceChanged(t *testing.T) {
	e := leader(t)
	ctx := context.Background()
	data := bytes.Repeat([]byte("fedcba9876543210"), 128<<10) // 2 MiB
	slow := newSlowSource(data)
	src := httptest.NewServer(slow)
	defer src.Close()
	release(t, e.st.Pool, "agent", "v1.0.0", releases.Asset{Name: "agent", Digest: digestOf(data), Size: int64(len(data)), URL: src.URL + "/agent"})
	interrupt(t, e, e.prefetcherWith(artifacts.Options{Keep: 3, SegmentSize: artifacts.ChunkSize}), len(data))
	// A new ETag: the committed bytes may belong to other content.
	slow.etag.Store(`"v2"`)
	if err := e.prefetcherWith(artifacts.Options{Keep: 3, SegmentSize: artifacts.ChunkSize}).Run(ctx, e.el.InTerm); err != nil {
		t.Fatal(err)
	}
	_, sent := slow.requests()
	if sent[len(sent)-1] != int64(len(data)) {
		t.Fatalf("bytes sent per request %v: the last must be the whole content", sent)
	}
	var from int64
	if err := e.st.Pool.QueryRow(ctx, `SELECT resumed_from FROM artifact_downloads`).Scan(&from); err != nil || from != 0 {
		t.Fatalf("resumed_from %d (%v), want 0", from, err)
	}
	if got := serve(t, e, digestOf(data)); !bytes.Equal(got, data) {
		t.Fatalf("served %d bytes that differ from the source", len(got))
	}
}

// The prefetcher writes through the fence that the job runner hands it:
// a run of an old term is refused while a newer term leads.
func TestPrefetchOfAnOldTermIsRefusedWhileANewerTermLeads(t *testing.T) {
	e := leader(t)
	ctx := context.Background()
	data := []byte("agent build")
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(data) }))
	defer src.Close()
	release(t, e.st.Pool, "agent", "v1.0.0", releases.Asset{Name: "agent", Digest: digestOf(data), Size: -1, URL: src.URL + "/agent"})
	old := e.el
	cur := e.nextTerm(t)
	if err := e.prefetcher(3).Run(ctx, old.InTerm); !errors.Is(err, pgleader.ErrStaleTerm) {
		t.Fatalf("want a stale-term error, got %v", err)
	}
	if b, _ := artifacts.Blobs(ctx, e.st.Pool); len(b) != 0 || largeObjects(t, e.st.Pool) != 0 {
		t.Fatalf("an old term stored: %+v", b)
	}
	if dls, _ := artifacts.Downloads(ctx, e.st.Pool); len(dls) != 0 {
		t.Fatalf("an old term recorded downloads: %+v", dls)
	}
	if err := e.prefetcher(3).Run(ctx, cur.InTerm); err != nil {
		t.Fatal(err)
	}
	var term int64
	if err := e.st.Pool.QueryRow(ctx, `SELECT term FROM artifact_blobs`).Scan(&term); err != nil || term != cur.Term() {
		t.Fatalf("blob term %d (%v), want %d", term, err, cur.Term())
	}
}

func TestRetentionKeepsNewestVersionsAndWhatAgentsRun(t *testing.T) {
	e := leader(t)
	ctx := context.Background()
	content := map[string][]byte{}
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(content[r.URL.Path]) }))
	defer src.Close()
	for _, v := range []string{"v1.0.0", "v1.1.0", "v1.2.0"} {
		content["/"+v] = []byte("agent " + v)
		release(t, e.st.Pool, "agent", v, releases.Asset{Name: "agent", Digest: digestOf(content["/"+v]), Size: -1, URL: src.URL + "/" + v})
	}
	if err := e.prefetcher(3).Run(ctx, e.el.InTerm); err != nil {
		t.Fatal(err)
	}
	if b, _ := artifacts.Blobs(ctx, e.st.Pool); len(b) != 3 {
		t.Fatalf("blobs: %+v", b)
	}
	// An agent runs v1.0.0; keep = 1 keeps v1.2.0 and v1.0.0.
	if _, err := e.st.Pool.Exec(ctx, `INSERT INTO agents (instance_uid, package_statuses) VALUES ('a1', '{"packages": {"agent": {"agent_has_version": "v1.0.0"}}}')`); err != nil {
		t.Fatal(err)
	}
	if err := e.prefetcher(1).Run(ctx, e.el.InTerm); err != nil {
		t.Fatal(err)
	}
	b, _ := artifacts.Blobs(ctx, e.st.Pool)
	kept := map[string]bool{}
	for _, x := range b {
		kept[x.Digest] = true
	}
	if len(b) != 2 || !kept[digestOf(content["/v1.2.0"])] || !kept[digestOf(content["/v1.0.0"])] || largeObjects(t, e.st.Pool) != 2 {
		t.Fatalf("kept: %+v", b)
	}
}

// A download abandoned mid-way because its release was dropped leaves a
// partial large object that retention removes.
func TestRetentionRemovesThePartialLargeObjectOfADroppedRelease(t *testing.T) {
	e := leader(t)
	ctx := context.Background()
	data := bytes.Repeat([]byte("0123456789abcdef"), 128<<10) // 2 MiB
	slow := newSlowSource(data)
	src := httptest.NewServer(slow)
	defer src.Close()
	release(t, e.st.Pool, "agent", "v1.0.0", releases.Asset{Name: "agent", Digest: digestOf(data), Size: int64(len(data)), URL: src.URL + "/agent"})
	interrupt(t, e, e.prefetcherWith(artifacts.Options{Keep: 3, SegmentSize: artifacts.ChunkSize}), len(data))
	if n := largeObjects(t, e.st.Pool); n != 1 {
		t.Fatalf("large objects after the interruption: %d", n)
	}
	if _, err := e.st.Pool.Exec(ctx, `DELETE FROM package_releases`); err != nil {
		t.Fatal(err)
	}
	if err := e.prefetcher(3).Run(ctx, e.el.InTerm); err != nil {
		t.Fatal(err)
	}
	dls, _ := artifacts.Downloads(ctx, e.st.Pool)
	if n := largeObjects(t, e.st.Pool); n != 0 || len(dls) != 1 || dls[0].State != "failed" || !strings.Contains(dls[0].Error, "abandoned") {
		t.Fatalf("large objects %d, downloads %+v", n, dls)
	}
}

// secretAuth accepts one fixed bearer token: the serving tests are about
// serving, not credentials (myriarchd's check is artifacts.AgentAuth).
func secretAuth(secret string) artifacts.AgentAuthorizer {
	return func(r *http.Request) error {
		if r.Header.Get("Authorization") == "Bearer "+secret {
			return nil
		}
		return artifacts.ErrUnauthorized
	}
}
