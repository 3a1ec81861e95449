package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/myriarch/myriarch/internal/fleet/artifacts"
	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore"
	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore/s3test"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// A leader killed with SIGKILL in the middle of a download leaves no blob,
// only the segments of the large object it committed; the new leader
// continues from there with a Range request (it does not fetch the whole
// artifact again), verifies the full digest and stores it, and no replica
// ever serves a partial blob.
func TestPrefetchLeaderKilledMidDownload(t *testing.T) {
	// 8.4 MB in segments of 256 KiB; the kill comes after a quarter.
	prefetchKill(t, bytes.Repeat([]byte("myriarch agent build "), 400_000), nil, 400_000*21/4)
}

// The same into S3: what survives the kill is the open multipart upload
// and the parts recorded in the download row; the new leader lists them,
// continues the upload from the recorded offset and completes it only
// after the digest verified. 40 MB: the kill comes after the first part
// (blobstore.S3PartSize) is recorded, before the second (the source holds
// after half).
func TestPrefetchLeaderKilledMidDownloadS3(t *testing.T) {
	srv := s3test.Start(t, "kill-artifacts")
	cfg := srv.Config("kill-artifacts", "kill/")
	data := bytes.Repeat([]byte("myriarch agent build "), 2_000_000)
	prefetchKill(t, data, map[string]string{"artifacts.store": "s3", "artifacts.s3Endpoint": cfg.Endpoint, "artifacts.s3Bucket": cfg.Bucket,
		"artifacts.s3Prefix": cfg.Prefix, "artifacts.s3Region": cfg.Region, "artifacts.s3AccessKey": cfg.AccessKey,
		"artifacts.s3SecretKey": cfg.SecretKey, "artifacts.s3Tls": "false"}, blobstore.S3PartSize)
	for u := range srv.Client().ListIncompleteUploads(context.Background(), "kill-artifacts", "", true) {
		t.Fatalf("an upload left open: %+v", u)
	}
	if keys, err := srv.Keys(context.Background(), "kill-artifacts", ""); err != nil || len(keys) != 1 {
		t.Fatalf("objects %q (%v): want the blob only", keys, err)
	}
}

// prefetchKill kills the leader once at least killAfter bytes of data are
// committed (recorded for a resume) and checks that the other replica
// resumes the download and serves exactly data.
func prefetchKill(t *testing.T, data []byte, extra map[string]string, killAfter int64) {
	pg := pgtest.New(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	// The source sends the first half of what is asked, then holds the rest
	// until released: "mid-download" is deterministic. It answers Range
	// requests (206) and records them.
	var released atomic.Bool
	var mu sync.Mutex
	var ranges []string
	var sent []int64
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		i := len(ranges)
		ranges, sent = append(ranges, r.Header.Get("Range")), append(sent, 0)
		mu.Unlock()
		write := func(b []byte) {
			n, _ := w.Write(b)
			mu.Lock()
			sent[i] += int64(n)
			mu.Unlock()
		}
		w.Header().Set("ETag", `"build-1"`)
		w.Header().Set("Accept-Ranges", "bytes")
		from := 0
		if rg, ok := strings.CutPrefix(r.Header.Get("Range"), "bytes="); ok && strings.HasSuffix(rg, "-") && r.Header.Get("If-Range") == `"build-1"` {
			from, _ = strconv.Atoi(strings.TrimSuffix(rg, "-"))
			w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", from, len(data)-1, len(data)))
			w.Header().Set("Content-Length", strconv.Itoa(len(data)-from))
			w.WriteHeader(http.StatusPartialContent)
		} else {
			w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		}
		body := data[from:]
		half := len(body) / 2
		if released.Load() {
			half = len(body)
		}
		write(body[:half])
		w.(http.Flusher).Flush()
		for !released.Load() {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		write(body[half:])
	}))
	defer src.Close()

	settings := func(id string) map[string]string {
		m := map[string]string{"database.url": pg.DSN(""), "server.enrollmentSecret": testSecret, "ha.replicaId": id,
			"ha.leaderSessionTimeout": "10s", "ha.heartbeatInterval": "1s", "jobs.artifactPrefetchInterval": "1s",
			"artifacts.segmentBytes": "262144"}
		maps.Copy(m, extra)
		return m
	}
	a := startReplica(t, settings("replica-a"))
	if !fleettest.Eventually(time.Minute, a.leads) {
		t.Fatal("replica-a does not lead")
	}
	b := startReplica(t, settings("replica-b"))

	for _, q := range []string{
		`INSERT INTO package_sources (name, type, source, poll_interval_ms, last_polled_at) VALUES ('agent', 'github', 'o/r', 86400000, now())`,
		`INSERT INTO package_releases (package, version, published_at, term) VALUES ('agent', 'v1.0.0', now(), 1)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO package_assets (package, version, name, digest, size, url) VALUES ('agent', 'v1.0.0', 'agent.tgz', $1, $2, $3)`,
		digest, len(data), src.URL+"/agent.tgz"); err != nil {
		t.Fatal(err)
	}

	var dl artifacts.Progress
	progress := func() artifacts.Progress {
		ds, _ := artifacts.Downloads(ctx, pool)
		if len(ds) == 0 {
			return artifacts.Progress{}
		}
		return ds[0]
	}
	if !fleettest.Eventually(time.Minute, func() bool {
		dl = progress()
		var w int64
		_ = pool.QueryRow(ctx, `SELECT written FROM artifact_downloads`).Scan(&w)
		return dl.State == "downloading" && dl.ReplicaID == "replica-a" && w >= killAfter
	}) {
		t.Fatalf("no download in progress on the leader: %+v", dl)
	}
	// A download token as a package offer carries it (the enrollment
	// secret is not accepted there).
	dlToken, err := artifacts.NewTokens(pool).Issue(ctx, "prefetch-kill-agent", digest)
	if err != nil {
		t.Fatal(err)
	}
	get := func(r *replicaProc) (int, []byte) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+r.http+artifacts.PathPrefix+digest, nil)
		req.Header.Set("Authorization", "Bearer "+dlToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, body
	}
	if code, _ := get(b); code != http.StatusNotFound {
		t.Fatalf("a blob being downloaded is served: %d", code)
	}

	a.signal(syscall.SIGKILL)
	a.waitExit()
	// No blob; what survives is the committed part of the large object.
	var written int64
	if err := pool.QueryRow(ctx, `SELECT written FROM artifact_downloads`).Scan(&written); err != nil || written <= 0 {
		t.Fatalf("nothing committed before the kill: %d %v", written, err)
	}
	var blobs int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM artifact_blobs`).Scan(&blobs); err != nil || blobs != 0 {
		t.Fatalf("a blob row after the kill: %d %v", blobs, err)
	}
	if code, _ := get(b); code != http.StatusNotFound {
		t.Fatalf("after the kill: %d", code)
	}

	// The new leader continues the download and completes it.
	if !fleettest.Eventually(time.Minute, func() bool {
		dl = progress()
		return dl.ReplicaID == "replica-b" && dl.Bytes > 0
	}) {
		t.Fatalf("replica-b did not take the download over: %+v", dl)
	}
	released.Store(true)
	var code int
	var body []byte
	if !fleettest.Eventually(time.Minute, func() bool {
		code, body = get(b)
		return code == http.StatusOK
	}) {
		t.Fatalf("blob not served after the takeover: %d", code)
	}
	if !bytes.Equal(body, data) {
		t.Fatalf("served %d bytes that differ from the release", len(body))
	}
	dl = progress()
	wantStore := "pg"
	if extra["artifacts.store"] == "s3" {
		wantStore = "s3"
	}
	if dl.State != "done" || dl.ReplicaID != "replica-b" || dl.Attempts < 2 || dl.Bytes != int64(len(data)) || dl.Store != wantStore {
		t.Fatalf("download record: %+v", dl)
	}
	// replica-b asked the source for the rest only.
	var from int64
	if err := pool.QueryRow(ctx, `SELECT resumed_from FROM artifact_downloads`).Scan(&from); err != nil || from < written {
		t.Fatalf("resumed from %d (%v), want at least the %d bytes committed before the kill", from, err, written)
	}
	mu.Lock()
	defer mu.Unlock()
	last := len(ranges) - 1
	if ranges[last] != fmt.Sprintf("bytes=%d-", from) || sent[last] != int64(len(data))-from || sent[last] >= int64(len(data)) {
		t.Fatalf("requests to the source: ranges %q, bytes sent %v; want the last from byte %d", ranges, sent, from)
	}
	t.Logf("replica-a committed %d of %d bytes before the kill; replica-b fetched the remaining %d", written, len(data), sent[last])
}
