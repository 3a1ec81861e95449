package artifacts_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/artifacts"
	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore"
	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore/s3test"
	"github.com/myriarch/myriarch/internal/fleet/releases"
)

// awsLike stands in front of gofakes3 and answers, like AWS S3, a repeated
// CompleteMultipartUpload of an upload already completed with 200 (gofakes3
// answers NoSuchUpload). It holds the first Complete request until release
// is called: the leader that sent it is paused between its ownership check
// and the store's answer.
type awsLike struct {
	rp        *httputil.ReverseProxy
	mu        sync.Mutex
	completed map[string]bool
	first     bool
	held      chan struct{}
	release   chan struct{}
	once      sync.Once
}

func newAWSLike(t *testing.T, srv *s3test.Server) (*awsLike, *blobstore.S3) {
	t.Helper()
	u, err := url.Parse("http://" + srv.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	a := &awsLike{rp: httputil.NewSingleHostReverseProxy(u), completed: map[string]bool{}, held: make(chan struct{}), release: make(chan struct{})}
	ps := httptest.NewServer(a)
	// Registered after ps.Close's cleanup below runs first: release before
	// closing, so a held request does not keep Close waiting.
	t.Cleanup(ps.Close)
	t.Cleanup(a.Release)
	return a, proxied(t, srv, ps)
}

// proxied is an S3 store of srv's bucket reached through the server ps.
func proxied(t *testing.T, srv *s3test.Server, ps *httptest.Server) *blobstore.S3 {
	t.Helper()
	cfg := srv.Config(bucket, "fleet-a")
	cfg.Endpoint = strings.TrimPrefix(ps.URL, "http://")
	st, err := blobstore.NewS3(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// Release lets the held Complete request go on (idempotent).
func (a *awsLike) Release() { a.once.Do(func() { close(a.release) }) }

func (a *awsLike) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("uploadId")
	if r.Method != http.MethodPost || id == "" {
		a.rp.ServeHTTP(w, r)
		return
	}
	a.mu.Lock()
	hold := !a.first
	a.first = true
	a.mu.Unlock()
	if hold {
		close(a.held)
		<-a.release
	}
	a.mu.Lock()
	done := a.completed[id]
	a.mu.Unlock()
	if done {
		w.Header().Set("Content-Type", "application/xml")
		fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><CompleteMultipartUploadResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Location>x</Location><Bucket>%s</Bucket><Key>%s</Key><ETag>"0-1"</ETag></CompleteMultipartUploadResult>`,
			bucket, strings.TrimPrefix(r.URL.Path, "/"+bucket+"/"))
		return
	}
	rec := httptest.NewRecorder()
	a.rp.ServeHTTP(rec, r)
	if rec.Code == http.StatusOK && !bytes.Contains(rec.Body.Bytes(), []byte("<Error>")) {
		a.mu.Lock()
		a.completed[id] = true
		a.mu.Unlock()
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

// A leader that lost its term after its ownership check, with its
// CompleteMultipartUpload in flight, while the newer term continued the
// same upload, completed it (AWS answers the repeated Complete with 200)
// and registered the object: the stale leader's final transaction is
// refused, and it must not delete the object, whose key is the upload's and
// so the newer term's too. The blob stays servable.
func TestS3StaleLeaderCompletingTheSharedUploadKeepsTheRegisteredObject(t *testing.T) {
	srv := s3test.Start(t, bucket)
	proxy, st := newAWSLike(t, srv)
	e := leader(t)
	ctx := context.Background()
	const part = blobstore.S3MinPartSize
	data := bytes.Repeat([]byte("fedcba9876543210"), (2*part+part/2)/16)
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(data) }))
	defer src.Close()
	release(t, e.st.Pool, "agent", "v1.0.0", releases.Asset{Name: "agent", Digest: digestOf(data), Size: int64(len(data)), URL: src.URL + "/agent"})
	opts := artifacts.Options{Keep: 3, S3: st, StoreS3: true, S3PartSize: part}

	old := e.el
	staleDone := make(chan error, 1)
	go func() { staleDone <- e.prefetcherWith(opts).Run(ctx, old.InTerm) }()
	select {
	case <-proxy.held:
	case <-time.After(60 * time.Second):
		t.Fatal("the old leader never completed its upload")
	}
	cur := e.nextTerm(t)
	if err := e.prefetcherWith(opts).Run(ctx, cur.InTerm); err != nil {
		t.Fatal(err)
	}
	var key string
	if err := e.st.Pool.QueryRow(ctx, `SELECT object_key FROM artifact_blobs`).Scan(&key); err != nil {
		t.Fatal(err)
	}
	proxy.Release()
	if err := <-staleDone; err == nil {
		t.Fatal("the stale leader's run reported success")
	}
	keys, err := srv.Keys(ctx, bucket, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0] != key {
		t.Fatalf("objects %q: want the registered %s only", keys, key)
	}
	if got := serve(t, e, digestOf(data), st); !bytes.Equal(got, data) {
		t.Fatalf("served %d bytes that differ from the source", len(got))
	}
}

// A store that answers ListParts with a transient error (503 SlowDown)
// during a resume: the attempt fails and keeps the upload, and the next
// attempt, with the store answering again, continues it from the recorded
// offset instead of starting again from byte 0.
func TestS3TransientErrorListingPartsKeepsTheUploadForTheNextAttempt(t *testing.T) {
	srv := s3test.Start(t, bucket)
	u, err := url.Parse("http://" + srv.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	var fail atomic.Bool
	var listCalls atomic.Int64
	ps := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Query().Get("uploadId") != "" {
			listCalls.Add(1)
			if fail.Load() {
				w.Header().Set("Content-Type", "application/xml")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>`))
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	defer ps.Close()
	st := proxied(t, srv, ps)
	e := leader(t)
	ctx := context.Background()
	opts, data, slow := s3Interrupted(t, e, st)
	before := recordedUpload(t, e)
	fail.Store(true)
	err = e.prefetcherWith(opts).Run(ctx, e.el.InTerm)
	if err == nil || !strings.Contains(err.Error(), "SlowDown") && !strings.Contains(err.Error(), "reduce your request rate") {
		t.Fatalf("want the store's transient error, got %v", err)
	}
	if listCalls.Load() == 0 {
		t.Fatal("the parts were never listed")
	}
	if after := recordedUpload(t, e); after.id != before.id || after.written != before.written {
		t.Fatalf("record after the transient error: %+v, before %+v", after, before)
	}
	if ids := openUploads(t, srv); len(ids) != 1 || ids[0] != before.id {
		t.Fatalf("open uploads %q: want the recorded %s", ids, before.id)
	}
	fail.Store(false)
	close(slow.release)
	if err := e.prefetcherWith(opts).Run(ctx, e.el.InTerm); err != nil {
		t.Fatal(err)
	}
	ranges, _ := slow.requests()
	if last := ranges[len(ranges)-1]; last != fmt.Sprintf("bytes=%d-", before.written) {
		t.Fatalf("source requests %q: want the last to continue at byte %d", ranges, before.written)
	}
	if got := serve(t, e, digestOf(data), st); !bytes.Equal(got, data) {
		t.Fatalf("served %d bytes that differ from the source", len(got))
	}
}

// A claimer that lost its term while paused between its claim and its
// check of the upload (here: its ListParts held, then answered that the
// store does not list parts) gives the upload up only under the row lock
// and its term: the newer term has claimed and recorded the same upload
// meanwhile, so the stale claimer leaves it alone and the newer term's
// next attempt continues it.
func TestS3StaleClaimerDoesNotAbortTheUploadANewerTermContinues(t *testing.T) {
	srv := s3test.Start(t, bucket)
	u, err := url.Parse("http://" + srv.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	var hold atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	ps := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Query().Get("uploadId") != "" && hold.CompareAndSwap(true, false) {
			close(held)
			<-release
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusNotImplemented)
			_, _ = w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>NotImplemented</Code><Message>A header you provided implies functionality that is not implemented.</Message></Error>`))
			return
		}
		rp.ServeHTTP(w, r)
	}))
	defer ps.Close()
	defer releaseAll()
	st := proxied(t, srv, ps)
	e := leader(t)
	ctx := context.Background()
	opts, data, _ := s3Interrupted(t, e, st)
	before := recordedUpload(t, e)

	hold.Store(true)
	old := e.el
	staleDone := make(chan error, 1)
	go func() { staleDone <- e.prefetcherWith(opts).Run(ctx, old.InTerm) }()
	select {
	case <-held:
	case <-time.After(60 * time.Second):
		t.Fatal("the old claimer never listed the parts")
	}
	cur := e.nextTerm(t)
	// The newer term claims the download and keeps the upload (its source
	// fails for now).
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "down", http.StatusBadGateway) }))
	defer failing.Close()
	var url0 string
	if err := e.st.Pool.QueryRow(ctx, `SELECT url FROM package_assets`).Scan(&url0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.Pool.Exec(ctx, `UPDATE package_assets SET url = $1`, failing.URL+"/agent"); err != nil {
		t.Fatal(err)
	}
	if err := e.prefetcherWith(opts).Run(ctx, cur.InTerm); err == nil || !strings.Contains(err.Error(), "502") {
		t.Fatalf("want the source's error, got %v", err)
	}
	if after := recordedUpload(t, e); after.id != before.id || after.term != cur.Term() {
		t.Fatalf("record after the newer term's attempt: %+v, want upload %s of term %d", after, before.id, cur.Term())
	}
	releaseAll()
	if err := <-staleDone; err == nil {
		t.Fatal("the stale claimer's run reported success")
	}
	if ids := openUploads(t, srv); len(ids) != 1 || ids[0] != before.id {
		t.Fatalf("open uploads %q: want the newer term's %s", ids, before.id)
	}
	if after := recordedUpload(t, e); after.id != before.id || after.written != before.written {
		t.Fatalf("record after the stale claimer: %+v, before %+v", after, before)
	}
	// The newer term continues the upload where it was.
	if _, err := e.st.Pool.Exec(ctx, `UPDATE package_assets SET url = $1`, url0); err != nil {
		t.Fatal(err)
	}
	if err := e.prefetcherWith(opts).Run(ctx, cur.InTerm); err != nil {
		t.Fatal(err)
	}
	dls, _ := artifacts.Downloads(ctx, e.st.Pool)
	if len(dls) != 1 || dls[0].State != "done" || dls[0].ResumedFrom != before.written {
		t.Fatalf("download record: %+v, want resumed from %d", dls, before.written)
	}
	if got := serve(t, e, digestOf(data), st); !bytes.Equal(got, data) {
		t.Fatalf("served %d bytes that differ from the source", len(got))
	}
}

// A blob whose object went missing from the bucket (deleted by hand, a
// lifecycle rule) is forgotten by the sweep once its row is older than the
// grace, and the next run downloads it again; a younger row is left alone
// (its object may be registered after the listing was made).
func TestS3BlobWhoseObjectIsMissingIsDownloadedAgain(t *testing.T) {
	srv := s3test.Start(t, bucket)
	st := s3Store(t, srv)
	e := leader(t)
	ctx := context.Background()
	data := []byte("agent v1.0.0 small")
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(data) }))
	defer src.Close()
	release(t, e.st.Pool, "agent", "v1.0.0", releases.Asset{Name: "agent", Digest: digestOf(data), Size: int64(len(data)), URL: src.URL + "/agent"})
	opts := artifacts.Options{Keep: 3, S3: st, StoreS3: true}
	if err := e.prefetcherWith(opts).Run(ctx, e.el.InTerm); err != nil {
		t.Fatal(err)
	}
	var key string
	if err := e.st.Pool.QueryRow(ctx, `SELECT object_key FROM artifact_blobs`).Scan(&key); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := e.prefetcherWith(opts).Run(ctx, e.el.InTerm); err != nil {
		t.Fatal(err)
	}
	var again string
	if err := e.st.Pool.QueryRow(ctx, `SELECT object_key FROM artifact_blobs`).Scan(&again); err != nil || again != key {
		t.Fatalf("a young row: object key %q (%v), want it kept as %q", again, err, key)
	}
	if _, err := e.st.Pool.Exec(ctx, `UPDATE artifact_blobs SET stored_at = now() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	// This run forgets the blob; the next one downloads it again.
	for range 2 {
		if err := e.prefetcherWith(opts).Run(ctx, e.el.InTerm); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.st.Pool.QueryRow(ctx, `SELECT object_key FROM artifact_blobs`).Scan(&again); err != nil || again == key {
		t.Fatalf("object key %q (%v), want a new one", again, err)
	}
	if got := serve(t, e, digestOf(data), st); !bytes.Equal(got, data) {
		t.Fatalf("served %q", got)
	}
}
