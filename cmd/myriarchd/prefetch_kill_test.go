package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/myriarch/myriarch/internal/fleet/artifacts"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// A leader killed with SIGKILL in the middle of a download leaves no blob
// (its transaction, large object included, is gone with its connections);
// the new leader downloads again, verifies and stores it, and no replica
// ever serves a partial blob.
func TestPrefetchLeaderKilledMidDownload(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	data := bytes.Repeat([]byte("myriarch agent build "), 400_000) // 8.4 MB
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	// The source sends the first half, then holds the rest until released:
	// "mid-download" is deterministic.
	var released atomic.Bool
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		half := len(data) / 2
		if released.Load() {
			half = len(data)
		}
		w.Write(data[:half])
		w.(http.Flusher).Flush()
		for !released.Load() {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		w.Write(data[half:])
	}))
	defer src.Close()

	settings := func(id string) map[string]string {
		return map[string]string{"database.url": pg.DSN(""), "server.enrollmentSecret": testSecret, "ha.replicaId": id,
			"ha.leaderSessionTimeout": "10s", "ha.heartbeatInterval": "1s", "jobs.artifactPrefetchInterval": "1s"}
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
		return dl.State == "downloading" && dl.ReplicaID == "replica-a" && dl.Bytes > 0
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
	// Nothing of the interrupted download survives.
	if !fleettest.Eventually(time.Minute, func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_largeobject_metadata) + (SELECT count(*) FROM artifact_blobs)`).Scan(&n)
		return n == 0
	}) {
		t.Fatal("a partial blob or large object survived the kill")
	}
	if code, _ := get(b); code != http.StatusNotFound {
		t.Fatalf("after the kill: %d", code)
	}

	// The new leader starts the download again and completes it.
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
	if dl.State != "done" || dl.ReplicaID != "replica-b" || dl.Attempts < 2 || dl.Bytes != int64(len(data)) {
		t.Fatalf("download record: %+v", dl)
	}
}
