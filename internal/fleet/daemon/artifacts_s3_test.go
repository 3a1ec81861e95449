package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/artifacts"
	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore/s3test"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// A replica configured with artifacts.store s3 (secret key from a file)
// prefetches into the bucket and serves the blob from there.
func TestArtifactsInS3AreStoredAndServed(t *testing.T) {
	pg := pgtest.New(t)
	srv := s3test.Start(t, "fleet-artifacts")
	data := bytes.Repeat([]byte("agent build "), 100_000)
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(data) }))
	defer src.Close()
	keyFile := filepath.Join(t.TempDir(), "s3-secret")
	if err := os.WriteFile(keyFile, []byte(s3test.SecretKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := start(t, testConfig(t, pg.DSN(""), "r1", map[string]string{
		"jobs.artifactPrefetchInterval": "1s", "artifacts.store": "s3", "artifacts.s3Endpoint": srv.Endpoint(),
		"artifacts.s3Bucket": "fleet-artifacts", "artifacts.s3Prefix": "prod/", "artifacts.s3Region": s3test.Region,
		"artifacts.s3AccessKey": s3test.AccessKey, "artifacts.s3SecretKeyFile": keyFile, "artifacts.s3Tls": "false",
	}), nil)
	defer func() { _ = d.Shutdown() }()
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO package_sources (name, type, source, poll_interval_ms, last_polled_at) VALUES ('agent', 'github', 'o/r', 86400000, now())`,
		`INSERT INTO package_releases (package, version, published_at, term) VALUES ('agent', 'v1.0.0', now(), 1)`,
	} {
		if _, err := d.Store.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.Store.Pool.Exec(ctx, `INSERT INTO package_assets (package, version, name, digest, size, url) VALUES ('agent', 'v1.0.0', 'agent', $1, $2, $3)`,
		digest, len(data), src.URL+"/agent"); err != nil {
		t.Fatal(err)
	}
	var blobs []artifacts.Blob
	if !fleettest.Eventually(time.Minute, func() bool {
		blobs, _ = artifacts.Blobs(ctx, d.Store.Pool)
		return len(blobs) == 1
	}) {
		dls, _ := artifacts.Downloads(ctx, d.Store.Pool)
		t.Fatalf("not stored: %+v", dls)
	}
	if keys, _ := srv.Keys(ctx, "fleet-artifacts", "prod/blobs/"); blobs[0].Store != "s3" || len(keys) != 1 {
		t.Fatalf("blob %+v, objects %q", blobs[0], keys)
	}
	// A download token as a package offer carries it.
	tok, err := artifacts.NewTokens(d.Store.Pool).Issue(ctx, "s3-agent", digest)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+d.HTTPAddr().String()+artifacts.PathPrefix+digest, nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, data) {
		t.Fatalf("served %d, %d bytes", resp.StatusCode, len(body))
	}
}
