package artifacts_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
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
	"github.com/myriarch/myriarch/internal/testnet"
	"github.com/myriarch/myriarch/pgleader"
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
	// its term) is garbage once older than the sweep's grace (younger, it
	// may be one that a newer leader completed and has not registered
	// yet); keep = 1 removes v1.0.0 and v1.1.0 too, at once.
	const lost = "fleet-a/blobs/sha256/0000.t9-lost"
	if _, err := srv.Client().PutObject(ctx, bucket, lost, strings.NewReader("lost"), 4, minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.prefetcherWith(artifacts.Options{Keep: 1, S3: st, StoreS3: true}).Run(ctx, e.el.InTerm); err != nil {
		t.Fatal(err)
	}
	blobs, _ = artifacts.Blobs(ctx, e.st.Pool)
	keys, _ = srv.Keys(ctx, bucket, "fleet-a/")
	if len(blobs) != 1 || blobs[0].Digest != digestOf(big) || len(keys) != 2 || !slices.Contains(keys, lost) {
		t.Fatalf("after retention: blobs %+v, objects %q; want the big blob's and the young %s", blobs, keys, lost)
	}
	if err := e.prefetcherWith(artifacts.Options{Keep: 1, S3: st, StoreS3: true, S3SweepGrace: time.Nanosecond}).Run(ctx, e.el.InTerm); err != nil {
		t.Fatal(err)
	}
	if keys, _ = srv.Keys(ctx, bucket, "fleet-a/"); len(keys) != 1 || keys[0] == lost {
		t.Fatalf("objects after the grace: %q, want the big blob's only", keys)
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
	down, err := blobstore.NewS3(blobstore.S3Config{Endpoint: testnet.DeadAddr(t), Bucket: bucket, AccessKey: "k", SecretKey: "s", Region: s3test.Region})
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

// upload is the multipart upload that a download row records.
type upload struct {
	key, id string
	written int64
	parts   []blobstore.Part
	term    int64
}

func recordedUpload(t *testing.T, e env) upload {
	t.Helper()
	var u upload
	var key, id *string
	if err := e.st.Pool.QueryRow(context.Background(), `SELECT s3_key, s3_upload_id, written, coalesce(s3_parts, '[]'), term FROM artifact_downloads`).
		Scan(&key, &id, &u.written, &u.parts, &u.term); err != nil {
		t.Fatal(err)
	}
	if key != nil && id != nil {
		u.key, u.id = *key, *id
	}
	return u
}

// openUploads lists the unfinished multipart uploads in the bucket.
func openUploads(t *testing.T, srv *s3test.Server) []string {
	t.Helper()
	var ids []string
	for u := range srv.Client().ListIncompleteUploads(context.Background(), bucket, "", true) {
		if u.Err != nil {
			t.Fatal(u.Err)
		}
		ids = append(ids, u.UploadID)
	}
	return ids
}

// s3Interrupted starts a download into S3 in parts of the smallest size
// S3 allows, ends the run after the first part is recorded, and returns
// what was recorded. The data is two and a half parts long; the source
// holds after half of it (in the second part).
func s3Interrupted(t *testing.T, e env, st *blobstore.S3) (opts artifacts.Options, data []byte, slow *slowSource) {
	t.Helper()
	const part = blobstore.S3MinPartSize
	data = bytes.Repeat([]byte("0123456789abcdef"), (2*part+part/2)/16)
	slow = newSlowSource(data)
	src := httptest.NewServer(slow)
	t.Cleanup(src.Close)
	release(t, e.st.Pool, "agent", "v1.0.0", releases.Asset{Name: "agent", Digest: digestOf(data), Size: int64(len(data)), URL: src.URL + "/agent"})
	opts = artifacts.Options{Keep: 3, S3: st, StoreS3: true, S3PartSize: part}
	interruptAt(t, e, e.prefetcherWith(opts), part)
	return opts, data, slow
}

// A leader that loses its term after some parts leaves the multipart upload
// open and its parts recorded; a run of the old term is refused and changes
// nothing; the run of the newer term lists the parts, continues from the
// recorded offset with a Range request (fetching only the rest), verifies
// the digest, completes the upload and serves the blob.
func TestS3UploadInterruptedByLossOfLeadershipResumesUnderANewerTerm(t *testing.T) {
	srv := s3test.Start(t, bucket)
	st := s3Store(t, srv)
	e := leader(t)
	ctx := context.Background()
	opts, data, slow := s3Interrupted(t, e, st)
	before := recordedUpload(t, e)
	if before.id == "" || before.written != blobstore.S3MinPartSize || len(before.parts) != 1 || before.parts[0].Size != before.written {
		t.Fatalf("recorded after the interruption: %+v", before)
	}
	if ids := openUploads(t, srv); len(ids) != 1 || ids[0] != before.id {
		t.Fatalf("open uploads %q, want the recorded %s", ids, before.id)
	}
	if keys, _ := srv.Keys(ctx, bucket, ""); len(keys) != 0 {
		t.Fatalf("objects before the upload completed: %q", keys)
	}

	old := e.el
	cur := e.nextTerm(t)
	if err := e.prefetcherWith(opts).Run(ctx, old.InTerm); !errors.Is(err, pgleader.ErrStaleTerm) {
		t.Fatalf("a run of the old term: want a stale-term error, got %v", err)
	}
	if after := recordedUpload(t, e); after.id != before.id || after.written != before.written || after.term != before.term || len(after.parts) != 1 {
		t.Fatalf("the old term changed the record: %+v, before %+v", after, before)
	}

	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	if err := e.prefetcherWith(opts).Run(ctx, cur.InTerm); err != nil {
		t.Fatal(err)
	}
	ranges, sent := slow.requests()
	last := len(ranges) - 1
	if ranges[last] != fmt.Sprintf("bytes=%d-", before.written) || sent[last] != int64(len(data))-before.written || sent[last] >= int64(len(data)) {
		t.Fatalf("requests to the source: ranges %q, bytes sent %v; want the last from byte %d", ranges, sent, before.written)
	}
	if got := testutil.ToFloat64(counter(t, reg, "myriarch_artifact_downloads_resumed_total")); got != 1 {
		t.Fatalf("resumed counter %v", got)
	}
	if got := serve(t, e, digestOf(data), st); !bytes.Equal(got, data) {
		t.Fatalf("served %d bytes that differ from the source", len(got))
	}
	var term int64
	var key string
	if err := e.st.Pool.QueryRow(ctx, `SELECT term, object_key FROM artifact_blobs`).Scan(&term, &key); err != nil || term != cur.Term() || key != before.key {
		t.Fatalf("blob term %d key %q (%v), want term %d and the key of the continued upload %q", term, key, err, cur.Term(), before.key)
	}
	dls, _ := artifacts.Downloads(ctx, e.st.Pool)
	if dls[0].State != "done" || dls[0].Attempts != 2 || dls[0].ResumedFrom != before.written || dls[0].Store != "s3" {
		t.Fatalf("download record: %+v", dls[0])
	}
	if ids := openUploads(t, srv); len(ids) != 0 {
		t.Fatalf("uploads left open: %q", ids)
	}
	if u := recordedUpload(t, e); u.id != "" || len(u.parts) != 0 {
		t.Fatalf("the done download still names an upload: %+v", u)
	}
}

// An upload that the store no longer has (aborted by a lifecycle rule or
// by hand), or whose parts differ from the recorded ones, is not continued:
// the download starts again from byte 0 in a new upload and the served
// bytes are right. A part after the recorded ones (uploaded by an attempt
// that ended before it recorded it) does not stop the resume: it is
// uploaded again.
func TestS3ResumeChecksTheUploadsParts(t *testing.T) {
	put := func(t *testing.T, c minio.Core, u upload, n int, b []byte) {
		t.Helper()
		if _, err := c.PutObjectPart(context.Background(), bucket, u.key, u.id, n, bytes.NewReader(b), int64(len(b)),
			minio.PutObjectPartOptions{DisableContentSha256: true}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name    string
		spoil   func(t *testing.T, c minio.Core, u upload)
		resumes bool
	}{
		{"vanished", func(t *testing.T, c minio.Core, u upload) {
			if err := c.AbortMultipartUpload(context.Background(), bucket, u.key, u.id); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"part differs", func(t *testing.T, c minio.Core, u upload) {
			put(t, c, u, 1, bytes.Repeat([]byte("x"), int(u.parts[0].Size)))
		}, false},
		{"unrecorded part after", func(t *testing.T, c minio.Core, u upload) {
			put(t, c, u, 2, bytes.Repeat([]byte("y"), int(u.parts[0].Size)))
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := s3test.Start(t, bucket)
			st := s3Store(t, srv)
			e := leader(t)
			ctx := context.Background()
			opts, data, slow := s3Interrupted(t, e, st)
			u := recordedUpload(t, e)
			tc.spoil(t, minio.Core{Client: srv.Client()}, u)
			if err := e.prefetcherWith(opts).Run(ctx, e.el.InTerm); err != nil {
				t.Fatal(err)
			}
			ranges, sent := slow.requests()
			last := len(ranges) - 1
			from, wantKey := int64(0), false
			if tc.resumes {
				from, wantKey = u.written, true
				if ranges[last] != fmt.Sprintf("bytes=%d-", from) {
					t.Fatalf("requests to the source: ranges %q; want the last from byte %d", ranges, from)
				}
			} else if ranges[last] != "" {
				t.Fatalf("requests to the source: ranges %q; want the last from byte 0", ranges)
			}
			if sent[last] != int64(len(data))-from {
				t.Fatalf("bytes sent per request %v; want the last from byte %d", sent, from)
			}
			if got := serve(t, e, digestOf(data), st); !bytes.Equal(got, data) {
				t.Fatalf("served %d bytes that differ from the source", len(got))
			}
			var key string
			if err := e.st.Pool.QueryRow(ctx, `SELECT object_key FROM artifact_blobs`).Scan(&key); err != nil || (key == u.key) != wantKey {
				t.Fatalf("object key %q (%v), the interrupted upload's %q: want the same %v", key, err, u.key, wantKey)
			}
			dls, _ := artifacts.Downloads(ctx, e.st.Pool)
			if dls[0].State != "done" || dls[0].ResumedFrom != from {
				t.Fatalf("download record: %+v", dls[0])
			}
			if ids := openUploads(t, srv); len(ids) != 0 {
				t.Fatalf("uploads left open: %q", ids)
			}
		})
	}
}

// Retention keeps the upload that a failed download row names (the next
// attempt continues it) and aborts an upload that no row names (a leader
// that died before it recorded its first part) once it is older than the
// sweep's grace.
func TestS3RetentionAbortsOnlyUploadsNoDownloadNames(t *testing.T) {
	srv := s3test.Start(t, bucket)
	st := s3Store(t, srv)
	e := leader(t)
	ctx := context.Background()
	opts, _, _ := s3Interrupted(t, e, st)
	u := recordedUpload(t, e)
	stray, err := minio.Core{Client: srv.Client()}.NewMultipartUpload(ctx, bucket, "fleet-a/blobs/sha256/0000.t9-stray", minio.PutObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The source now fails: the run records a failed attempt (keeping the
	// upload for the next one), then applies retention.
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "down", http.StatusBadGateway) }))
	defer failing.Close()
	if _, err := e.st.Pool.Exec(ctx, `UPDATE package_assets SET url = $1`, failing.URL+"/agent"); err != nil {
		t.Fatal(err)
	}
	// Younger than the sweep's grace, the stray upload may be one that a
	// newer leader started and has not recorded yet: kept.
	if err := e.prefetcherWith(opts).Run(ctx, e.el.InTerm); err == nil || !strings.Contains(err.Error(), "502") {
		t.Fatalf("want the source's error, got %v", err)
	}
	if ids := openUploads(t, srv); len(ids) != 2 || !slices.Contains(ids, u.id) || !slices.Contains(ids, stray) {
		t.Fatalf("open uploads %q: want the recorded %s and the young %s", ids, u.id, stray)
	}
	opts.S3SweepGrace = time.Nanosecond
	if err := e.prefetcherWith(opts).Run(ctx, e.el.InTerm); err == nil || !strings.Contains(err.Error(), "502") {
		t.Fatalf("want the source's error, got %v", err)
	}
	if ids := openUploads(t, srv); len(ids) != 1 || ids[0] != u.id || ids[0] == stray {
		t.Fatalf("open uploads %q: want only the recorded %s", ids, u.id)
	}
	if after := recordedUpload(t, e); after.id != u.id || after.written != u.written {
		t.Fatalf("record after a failed attempt: %+v, before %+v", after, u)
	}
}

// A leader that lost its term but keeps running (paused, cut off) while the
// newer term continues and completes its upload cannot change anything:
// its next part finds the upload completed (or, had it been accepted,
// would not be recorded: the row names the newer term), and the blob, its
// row and the download record stay the newer term's.
func TestS3StaleLeaderThatKeepsRunningCannotTouchTheUploadTakenOver(t *testing.T) {
	srv := s3test.Start(t, bucket)
	st := s3Store(t, srv)
	e := leader(t)
	ctx := context.Background()
	const part = blobstore.S3MinPartSize
	data := bytes.Repeat([]byte("fedcba9876543210"), (2*part+part/2)/16)
	slow := newSlowSource(data)
	src := httptest.NewServer(slow)
	defer src.Close()
	release(t, e.st.Pool, "agent", "v1.0.0", releases.Asset{Name: "agent", Digest: digestOf(data), Size: int64(len(data)), URL: src.URL + "/agent"})
	opts := artifacts.Options{Keep: 3, S3: st, StoreS3: true, S3PartSize: part}

	old := e.el
	staleDone := make(chan error, 1)
	go func() { staleDone <- e.prefetcherWith(opts).Run(ctx, old.InTerm) }()
	// The old leader recorded its first part and waits for the source.
	if !fleettest.Eventually(30*time.Second, func() bool {
		var written int64
		_ = e.st.Pool.QueryRow(ctx, `SELECT written FROM artifact_downloads`).Scan(&written)
		return written >= part
	}) {
		t.Fatal("no part recorded")
	}
	cur := e.nextTerm(t)
	if err := e.prefetcherWith(opts).Run(ctx, cur.InTerm); err != nil {
		t.Fatal(err)
	}
	close(slow.release) // the old leader goes on
	if err := <-staleDone; err == nil {
		t.Fatal("the stale leader's run reported success")
	} else {
		t.Logf("the stale leader's run: %v", err)
	}
	var term int64
	if err := e.st.Pool.QueryRow(ctx, `SELECT term FROM artifact_blobs`).Scan(&term); err != nil || term != cur.Term() {
		t.Fatalf("blob term %d (%v), want %d", term, err, cur.Term())
	}
	if got := serve(t, e, digestOf(data), st); !bytes.Equal(got, data) {
		t.Fatalf("served %d bytes that differ from the source", len(got))
	}
	dls, _ := artifacts.Downloads(ctx, e.st.Pool)
	if u := recordedUpload(t, e); len(dls) != 1 || dls[0].State != "done" || dls[0].Error != "" || u.term != cur.Term() {
		t.Fatalf("download record: %+v, term %d", dls, u.term)
	}
	if ids := openUploads(t, srv); len(ids) != 0 {
		t.Fatalf("uploads left open: %q", ids)
	}
	if keys, _ := srv.Keys(ctx, bucket, ""); len(keys) != 1 {
		t.Fatalf("objects %q: want the blob only", keys)
	}
}
