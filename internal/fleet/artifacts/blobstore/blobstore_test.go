package blobstore_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/minio/minio-go/v7"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore"
	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore/s3test"
	"github.com/myriarch/myriarch/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// content spans several read chunks and does not end on a chunk boundary.
var content = func() []byte {
	b := make([]byte, 2*blobstore.ReadChunk+12345)
	for i := range b {
		b[i] = byte(i * 7 % 251)
	}
	return b
}()

// conformance checks what serving relies on: reads from any offset after
// a Seek, the end of the blob, and removal.
func conformance(t *testing.T, st blobstore.Store, ref blobstore.Ref, gone func() bool, tx func(fn func(pgx.Tx) error) error) {
	t.Helper()
	ctx := context.Background()
	set := blobstore.NewSet(st)
	r, err := set.Open(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if all, err := io.ReadAll(r); err != nil || !bytes.Equal(all, content) {
		t.Fatalf("whole blob: %d bytes, %v", len(all), err)
	}
	for _, off := range []int64{0, 1, blobstore.ReadChunk - 1, blobstore.ReadChunk, int64(len(content)) - 3} {
		if pos, err := r.Seek(off, io.SeekStart); err != nil || pos != off {
			t.Fatalf("seek %d: %d %v", off, pos, err)
		}
		got := make([]byte, min(100, int64(len(content))-off))
		if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, content[off:off+int64(len(got))]) {
			t.Fatalf("read at %d: %v", off, err)
		}
	}
	if end, err := r.Seek(0, io.SeekEnd); err != nil || end != int64(len(content)) {
		t.Fatalf("seek end: %d %v", end, err)
	}
	if n, err := r.Read(make([]byte, 10)); n != 0 || err != io.EOF {
		t.Fatalf("read at the end: %d %v", n, err)
	}
	if _, err := set.Open(ctx, blobstore.Ref{Kind: "elsewhere"}); !errors.Is(err, blobstore.ErrNoStore) {
		t.Fatalf("unknown kind: %v", err)
	}
	if err := tx(func(tx pgx.Tx) error { return st.Remove(ctx, tx, ref) }); err != nil {
		t.Fatal(err)
	}
	if !gone() {
		t.Fatal("the blob is still stored after Remove")
	}
}

func TestPG(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var oid uint32
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		los := tx.LargeObjects()
		if oid, err = los.Create(ctx, 0); err != nil {
			return err
		}
		obj, err := los.Open(ctx, oid, pgx.LargeObjectModeWrite)
		if err != nil {
			return err
		}
		_, err = obj.Write(content)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	conformance(t, blobstore.PG{Pool: pool}, blobstore.Ref{Kind: blobstore.KindPG, OID: oid, Size: int64(len(content))},
		func() bool {
			var n int
			_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_largeobject_metadata`).Scan(&n)
			return n == 0
		},
		func(fn func(pgx.Tx) error) error { return pgx.BeginFunc(ctx, pool, fn) })
}

func TestS3(t *testing.T) {
	srv := s3test.Start(t, "blobs")
	st, err := blobstore.NewS3(srv.Config("blobs", "p"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := st.Key("sha256:abc", "t1-x")
	if key != "p/blobs/sha256/abc.t1-x" {
		t.Fatalf("key %q", key)
	}
	if err := st.Put(ctx, key, bytes.NewReader(content), int64(len(content))); err != nil {
		t.Fatal(err)
	}
	conformance(t, st, blobstore.Ref{Kind: blobstore.KindS3, Key: key, Size: int64(len(content))},
		func() bool { keys, err := srv.Keys(ctx, "blobs", ""); return err == nil && len(keys) == 0 },
		func(fn func(pgx.Tx) error) error { return fn(nil) })
}

func TestS3ConfigErrors(t *testing.T) {
	if _, err := blobstore.NewS3(blobstore.S3Config{Bucket: "b"}); err == nil {
		t.Fatal("no endpoint accepted")
	}
	if _, err := blobstore.NewS3(blobstore.S3Config{Endpoint: "127.0.0.1:9", Bucket: "b", TLS: true, CAFile: "/nonexistent/ca.pem"}); err == nil {
		t.Fatal("a missing CA file accepted")
	}
}

// Only an answer that the store never lists parts gives up a resumable
// upload; a transient or unknown error keeps it for the next attempt.
func TestCannotListOnlyForAnswersThatDoNotChange(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{minio.ErrorResponse{Code: "NotImplemented", StatusCode: 501}, true},
		{minio.ErrorResponse{Code: "MethodNotAllowed", StatusCode: 405}, true},
		{minio.ErrorResponse{Code: "AccessDenied", StatusCode: 403}, true},
		{minio.ErrorResponse{StatusCode: 501}, true},
		{minio.ErrorResponse{Code: "SlowDown", StatusCode: 503}, false},
		{minio.ErrorResponse{Code: "InternalError", StatusCode: 500}, false},
		{minio.ErrorResponse{Code: "ServiceUnavailable", StatusCode: 503}, false},
		{minio.ErrorResponse{Code: "NoSuchUpload", StatusCode: 404}, false},
		{errors.New("dial tcp 127.0.0.1:9: connection refused"), false},
		{nil, false},
	} {
		if got := blobstore.CannotList(tc.err); got != tc.want {
			t.Errorf("CannotList(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
