// Package s3test serves an S3-compatible endpoint on a loopback port for
// tests and measurements: gofakes3 (github.com/johannesboyne/gofakes3, an
// independent MIT-licensed implementation of the S3 protocol, in memory)
// behind a real HTTP listener, so that clients speak the S3 wire protocol
// (signed requests, multipart uploads, ranged GETs) through minio-go as they
// would to a production store.
package s3test

import (
	"context"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/minio/minio-go/v7"

	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore"
)

// Credentials of the test endpoint (gofakes3 does not check signatures;
// they are sent anyway).
const (
	AccessKey = "myriarch-test"
	SecretKey = "myriarch-test-secret-key"
	Region    = "us-east-1"
)

// Server is a running S3 test endpoint.
type Server struct {
	srv *httptest.Server
	// Requests counts the HTTP requests the endpoint received.
	Requests atomic.Int64
}

// New starts an endpoint on a free loopback port.
func New() *Server {
	s := &Server{}
	h := gofakes3.New(s3mem.New(), gofakes3.WithAutoBucket(false)).Server()
	s.srv = httptest.NewServer(countingHandler{h: h, n: &s.Requests})
	return s
}

// Start starts an endpoint with bucket created and stops it when the test
// ends.
func Start(t testing.TB, bucket string) *Server {
	t.Helper()
	s := New()
	t.Cleanup(s.Close)
	if err := s.MakeBucket(context.Background(), bucket); err != nil {
		t.Fatal(err)
	}
	return s
}

// Endpoint is host:port.
func (s *Server) Endpoint() string { return strings.TrimPrefix(s.srv.URL, "http://") }

// Config is a store configuration for bucket and prefix on this endpoint.
func (s *Server) Config(bucket, prefix string) blobstore.S3Config {
	return blobstore.S3Config{Endpoint: s.Endpoint(), Bucket: bucket, Prefix: prefix, Region: Region,
		AccessKey: AccessKey, SecretKey: SecretKey}
}

// Client is a minio-go client of the endpoint.
func (s *Server) Client() *minio.Client {
	c, err := minio.New(s.Endpoint(), &minio.Options{Creds: nil, Region: Region})
	if err != nil {
		panic(err) // only a malformed endpoint fails, and ours is host:port
	}
	return c
}

// MakeBucket creates bucket.
func (s *Server) MakeBucket(ctx context.Context, bucket string) error {
	return s.Client().MakeBucket(ctx, bucket, minio.MakeBucketOptions{Region: Region})
}

// Keys lists the object keys in bucket under prefix.
func (s *Server) Keys(ctx context.Context, bucket, prefix string) ([]string, error) {
	var keys []string
	for o := range s.Client().ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if o.Err != nil {
			return nil, o.Err
		}
		keys = append(keys, o.Key)
	}
	return keys, nil
}

// Close stops the endpoint.
func (s *Server) Close() { s.srv.Close() }
