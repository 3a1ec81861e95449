package artifacts_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/myriarch/myriarch/internal/fleet/artifacts"
	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore"
	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore/s3test"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/jobs"
	"github.com/myriarch/myriarch/internal/fleet/releases"
	"github.com/myriarch/myriarch/internal/pgtest"
)

const bucket = "myriarch-artifacts"

func s3Store(t *testing.T, srv *s3test.Server) *blobstore.S3 {
	t.Helper()
	st, err := blobstore.NewS3(srv.Config(bucket, "fleet-a"))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestS3PrefetchServesWithRangeAndETagAndRetentionRemoves(t *testing.T) {
	srv := s3test.Start(t, bucket)
	st := s3Store(t, srv)
	e := leader(t)
	ctx := context.Background()
	content := map[string][]byte{}
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(content[r.URL.Path]) }))
	defer src.Close()
	// v1.2.0 is larger than a part of unknown size: a multipart upload.
	for i, v := range []string{"v1.0.0", "v1.1.0", "v1.2.0"} {
		b := []byte("agent " + v)
		if i == 2 {
			b = bytes.Repeat([]byte("agent v1.2.0 "), (blobstore.S3PartSize+3<<20)/13)
		}
		content["/"+v] = b
		release(t, e.st.Pool, "agent", v, releases.Asset{Name: "agent", Digest: digestOf(b), Size: -1, URL: src.URL + "/" + v})
	}
	p := e.prefetcherWith(artifacts.Options{Keep: 3, S3: st, StoreS3: true})
	if err := p.Run(ctx, e.el.InTerm); err != nil {
		t.Fatal(err)
	}
	blobs, _ := artifacts.Blobs(ctx, e.st.Pool)
	if len(blobs) != 3 || largeObjects(t, e.st.Pool) != 0 {
		t.Fatalf("blobs %+v, large objects %d", blobs, largeObjects(t, e.st.Pool))
	}
	for _, b := range blobs {
		if b.Store != blobstore.KindS3 {
			t.Fatalf("blob not in S3: %+v", b)
		}
	}
	keys, err := srv.Keys(ctx, bucket, "fleet-a/blobs/")
	if err != nil || len(keys) != 3 {
		t.Fatalf("objects %q (%v)", keys, err)
	}

	big := content["/v1.2.0"]
	h := artifacts.Handler(e.st.Pool, func(*http.Request) error { return nil }, nil, st)
	web := httptest.NewServer(h)
	defer web.Close()
	get := func(hdr ...string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, web.URL+artifacts.PathPrefix+digestOf(big), nil)
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
	etag := `"` + digestOf(big) + `"`
	if r, b := get(); r.StatusCode != http.StatusOK || !bytes.Equal(b, big) || r.Header.Get("ETag") != etag {
		t.Fatalf("full: %d, %d bytes, etag %q", r.StatusCode, len(b), r.Header.Get("ETag"))
	}
	off := int64(blobstore.S3PartSize - 5) // across the parts
	if r, b := get("Range", "bytes=16777211-16777230"); r.StatusCode != http.StatusPartialContent || !bytes.Equal(b, big[off:off+20]) {
		t.Fatalf("range: %d %q", r.StatusCode, b)
	}
	if r, b := get("Range", "bytes=100-", "If-Range", etag); r.StatusCode != http.StatusPartialContent || !bytes.Equal(b, big[100:]) {
		t.Fatalf("if-range: %d, %d bytes", r.StatusCode, len(b))
	}
	if r, _ := get("If-None-Match", etag); r.StatusCode != http.StatusNotModified {
		t.Fatalf("if-none-match: %d", r.StatusCode)
	}

	// An object that no blob row names (an upload of a leader that lost
	// its term) is garbage; keep = 1 removes v1.0.0 and v1.1.0 too.
	if _, err := srv.Client().PutObject(ctx, bucket, "fleet-a/blobs/sha256/0000.t9-lost", strings.NewReader("lost"), 4, minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.prefetcherWith(artifacts.Options{Keep: 1, S3: st, StoreS3: true}).Run(ctx, e.el.InTerm); err != nil {
		t.Fatal(err)
	}
	blobs, _ = artifacts.Blobs(ctx, e.st.Pool)
	keys, _ = srv.Keys(ctx, bucket, "fleet-a/")
	if len(blobs) != 1 || blobs[0].Digest != digestOf(big) || len(keys) != 1 {
		t.Fatalf("after retention: blobs %+v, objects %q", blobs, keys)
	}
	if got := serve(t, e, digestOf(big), st); !bytes.Equal(got, big) {
		t.Fatal("the kept blob is no longer served")
	}
}

func TestS3CorruptDownloadNeverBecomesServable(t *testing.T) {
	srv := s3test.Start(t, bucket)
	st := s3Store(t, srv)
	e := leader(t)
	ctx := context.Background()
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("tampered agent")) }))
	defer src.Close()
	good := []byte("the real agent")
	release(t, e.st.Pool, "agent", "v1.0.0", releases.Asset{Name: "agent", Digest: digestOf(good), Size: -1, URL: src.URL + "/agent"})
	err := e.prefetcherWith(artifacts.Options{Keep: 3, S3: st, StoreS3: true}).Run(ctx, e.el.InTerm)
	if err == nil || !strings.Contains(err.Error(), "digest mismatch") {
		t.Fatalf("want a digest mismatch, got %v", err)
	}
	if b, _ := artifacts.Blobs(ctx, e.st.Pool); len(b) != 0 {
		t.Fatalf("a corrupt blob is servable: %+v", b)
	}
	if keys, _ := srv.Keys(ctx, bucket, ""); len(keys) != 0 {
		t.Fatalf("the corrupt upload was kept: %q", keys)
	}
	dls, _ := artifacts.Downloads(ctx, e.st.Pool)
	if len(dls) != 1 || dls[0].State != "failed" || !strings.Contains(dls[0].Error, "digest mismatch") {
		t.Fatalf("download record: %+v", dls)
	}
}

// An S3 endpoint that refuses connections: the job reports the error in
// its status, the download record and the failure metric, and tries again
// at its next run; once the store is reachable the blob is stored.
func TestS3UnreachableIsReportedAndRetried(t *testing.T) {
	e := leader(t)
	ctx := context.Background()
	data := []byte("agent build")
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(data) }))
	defer src.Close()
	release(t, e.st.Pool, "agent", "v1.0.0", releases.Asset{Name: "agent", Digest: digestOf(data), Size: int64(len(data)), URL: src.URL + "/agent"})
	port, err := pgtest.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	down, err := blobstore.NewS3(blobstore.S3Config{Endpoint: "127.0.0.1:" + strconv.Itoa(port), Bucket: bucket, AccessKey: "k", SecretKey: "s", Region: s3test.Region})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	p := e.prefetcherWith(artifacts.Options{Keep: 3, S3: down, StoreS3: true, Registerer: reg})
	runner := jobs.NewRunner([]jobs.Job{p.Job(50 * time.Millisecond)}, "r1", nil, nil)
	lctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); runner.Lead(lctx, e.term, e.el.InTerm) }()
	ok := fleettest.Eventually(time.Minute, func() bool {
		s := runner.Statuses()[0]
		return s.Failures >= 2 && strings.Contains(s.Error, "uploading to s3://"+bucket)
	})
	stop()
	<-done
	if !ok {
		t.Fatalf("job status: %+v", runner.Statuses())
	}
	dls, _ := artifacts.Downloads(ctx, e.st.Pool)
	if len(dls) != 1 || dls[0].State != "failed" || dls[0].Attempts < 2 || !strings.Contains(dls[0].Error, "uploading") {
		t.Fatalf("download record: %+v", dls)
	}
	if n := testutil.ToFloat64(counter(t, reg, "myriarch_artifact_download_failures_total")); n < 2 {
		t.Fatalf("failure metric %v", n)
	}
	if b, _ := artifacts.Blobs(ctx, e.st.Pool); len(b) != 0 {
		t.Fatalf("blobs: %+v", b)
	}
	// Reachable again: the next run stores it.
	srv := s3test.Start(t, bucket)
	if err := e.prefetcherWith(artifacts.Options{Keep: 3, S3: s3Store(t, srv), StoreS3: true}).Run(ctx, e.el.InTerm); err != nil {
		t.Fatal(err)
	}
	if b, _ := artifacts.Blobs(ctx, e.st.Pool); len(b) != 1 || !slices.ContainsFunc(b, func(b artifacts.Blob) bool { return b.Store == "s3" }) {
		t.Fatalf("blobs after recovery: %+v", b)
	}
}
