package blobstore

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3PartSize is the part size of the multipart uploads: the memory of one
// upload (one part is buffered), what a failover can cost again (a part is
// recorded once the store has it) and, at S3's 10,000 parts, the largest
// blob (160 GiB).
const S3PartSize = 16 << 20

// S3MinPartSize is S3's smallest part (except the last one of an upload).
const S3MinPartSize = 5 << 20

// S3Config is an S3-compatible store. SecretKey is never logged or shown.
type S3Config struct {
	// Endpoint is host:port, without a scheme.
	Endpoint  string
	Bucket    string
	Prefix    string
	Region    string
	AccessKey string
	SecretKey string
	// TLS selects https; CAFile (PEM) adds CAs that verify the endpoint.
	TLS    bool
	CAFile string
}

// S3 is the S3-compatible store, spoken to through minio-go.
type S3 struct {
	c      *minio.Client
	bucket string
	prefix string
}

// NewS3 returns the store; it does not contact the endpoint.
func NewS3(cfg S3Config) (*S3, error) {
	if cfg.Endpoint == "" || cfg.Bucket == "" {
		return nil, errors.New("s3: endpoint and bucket are required")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("s3 CA file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("s3 CA file %s: no PEM certificate in it", cfg.CAFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	c, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:     credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure:    cfg.TLS,
		Region:    cfg.Region,
		Transport: tr,
		// A few quick retries of one request; the job retries the download
		// at its next run.
		MaxRetries: 3,
	})
	if err != nil {
		return nil, fmt.Errorf("s3 endpoint %q: %w", cfg.Endpoint, err)
	}
	p := strings.TrimPrefix(cfg.Prefix, "/")
	if p != "" && !strings.HasSuffix(p, "/") {
		p += "/"
	}
	return &S3{c: c, bucket: cfg.Bucket, prefix: p}, nil
}

// Kind is KindS3.
func (*S3) Kind() string { return KindS3 }

// String names the bucket and prefix (no credentials).
func (s *S3) String() string { return "s3://" + s.bucket + "/" + s.prefix }

// Key is the object key of an upload of digest; nonce makes every upload's
// key its own, so an upload of a leader that lost its term never
// overwrites the object of a blob that is already servable.
func (s *S3) Key(digest, nonce string) string {
	return s.prefix + "blobs/" + strings.ReplaceAll(digest, ":", "/") + "." + nonce
}

// Put uploads r (size bytes, -1 unknown) under key, streamed in parts of
// S3PartSize.
func (s *S3) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	// Unsigned payload with a Content-MD5 per request: the store checks
	// every part it receives. (Over plain http, minio-go would otherwise
	// sign the payload in aws-chunked framing, which not every
	// S3-compatible server decodes in multipart uploads; gofakes3 stores
	// the framing as data.)
	_, err := s.c.PutObject(ctx, s.bucket, key, r, size, minio.PutObjectOptions{
		ContentType: "application/octet-stream", PartSize: S3PartSize, NumThreads: 1,
		DisableContentSha256: true, SendContentMd5: true})
	return err
}

// Open reads the object with ranged GETs: Seek only moves the offset, the
// next Read asks for the bytes from there to the end.
func (s *S3) Open(ctx context.Context, r Ref) (io.ReadSeekCloser, error) {
	return &s3Reader{ctx: ctx, s: s, key: r.Key, size: r.Size}, nil
}

// Remove deletes the object. It does not use tx: the caller deletes the
// row first, so a failure here leaves garbage (removed by a later
// retention), never a row without its object.
func (s *S3) Remove(ctx context.Context, _ pgx.Tx, r Ref) error {
	if r.Key == "" {
		return nil
	}
	return s.c.RemoveObject(ctx, s.bucket, r.Key, minio.RemoveObjectOptions{})
}

// Upload is an unfinished multipart upload.
type Upload struct {
	Key, ID string
	// Initiated is when the store started the upload, as it lists it
	// (zero when unknown).
	Initiated time.Time
}

// Object is a blob object as the store lists it.
type Object struct {
	Key string
	// Modified is the object's LastModified (zero when unknown).
	Modified time.Time
}

// Objects returns every blob object under the prefix and the unfinished
// multipart uploads there.
func (s *S3) Objects(ctx context.Context) (objects []Object, incomplete []Upload, err error) {
	for o := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + "blobs/", Recursive: true}) {
		if o.Err != nil {
			return nil, nil, o.Err
		}
		objects = append(objects, Object{Key: o.Key, Modified: o.LastModified})
	}
	for u := range s.c.ListIncompleteUploads(ctx, s.bucket, s.prefix+"blobs/", true) {
		if u.Err != nil {
			// Listing multipart uploads is optional for S3-compatible
			// servers; the objects are what retention must see.
			break
		}
		incomplete = append(incomplete, Upload{Key: u.Key, ID: u.UploadID, Initiated: u.Initiated})
	}
	return objects, incomplete, nil
}

// Delete removes the object key.
func (s *S3) Delete(ctx context.Context, key string) error {
	return s.c.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{})
}

// Part is one uploaded part of a multipart upload, as the prefetcher
// records it (JSON) and the store lists it.
type Part struct {
	Number int    `json:"n"`
	ETag   string `json:"etag"`
	Size   int64  `json:"size"`
}

// ErrNoUpload is returned for a multipart upload that the store does not
// have (completed, aborted, or expired by a lifecycle rule).
var ErrNoUpload = errors.New("no such multipart upload")

// NewUpload starts a multipart upload of key and returns its id.
func (s *S3) NewUpload(ctx context.Context, key string) (string, error) {
	return minio.Core{Client: s.c}.NewMultipartUpload(ctx, s.bucket, key, minio.PutObjectOptions{ContentType: "application/octet-stream"})
}

// PutPart uploads b as part number n of the upload, with its Content-MD5
// so that the store checks what it received (unsigned payload, as Put).
func (s *S3) PutPart(ctx context.Context, key, uploadID string, n int, b []byte) (Part, error) {
	sum := md5.Sum(b)
	p, err := minio.Core{Client: s.c}.PutObjectPart(ctx, s.bucket, key, uploadID, n, bytes.NewReader(b), int64(len(b)),
		minio.PutObjectPartOptions{Md5Base64: base64.StdEncoding.EncodeToString(sum[:]), DisableContentSha256: true})
	if err != nil {
		return Part{}, noUpload(err)
	}
	return Part{Number: n, ETag: strings.Trim(p.ETag, `"`), Size: int64(len(b))}, nil
}

// Parts lists the parts the store holds of the upload, by part number.
func (s *S3) Parts(ctx context.Context, key, uploadID string) ([]Part, error) {
	var out []Part
	marker := 0
	for {
		r, err := minio.Core{Client: s.c}.ListObjectParts(ctx, s.bucket, key, uploadID, marker, 1000)
		if err != nil {
			return nil, noUpload(err)
		}
		for _, p := range r.ObjectParts {
			out = append(out, Part{Number: p.PartNumber, ETag: strings.Trim(p.ETag, `"`), Size: p.Size})
		}
		if !r.IsTruncated || r.NextPartNumberMarker <= marker {
			return out, nil
		}
		marker = r.NextPartNumberMarker
	}
}

// CompleteUpload assembles the parts into the object key.
func (s *S3) CompleteUpload(ctx context.Context, key, uploadID string, parts []Part) error {
	cp := make([]minio.CompletePart, len(parts))
	for i, p := range parts {
		cp[i] = minio.CompletePart{PartNumber: p.Number, ETag: p.ETag}
	}
	_, err := minio.Core{Client: s.c}.CompleteMultipartUpload(ctx, s.bucket, key, uploadID, cp, minio.PutObjectOptions{})
	return noUpload(err)
}

// AbortUpload removes an unfinished multipart upload and its parts.
func (s *S3) AbortUpload(ctx context.Context, key, uploadID string) error {
	return noUpload(minio.Core{Client: s.c}.AbortMultipartUpload(ctx, s.bucket, key, uploadID))
}

// CannotList reports whether err is the store's answer that it does not
// list the parts of a multipart upload, for good: not implemented (501,
// NotImplemented), method not allowed (405) or access denied (403: the
// credentials lack the permission). Any other error, a 5xx or SlowDown
// included, is transient or unknown: the caller tries again later rather
// than give up the upload.
func CannotList(err error) bool {
	if err == nil {
		return false
	}
	r := minio.ToErrorResponse(err)
	switch {
	case r.Code == "NotImplemented" || r.Code == "MethodNotAllowed" || r.Code == "AccessDenied":
		return true
	case r.StatusCode == http.StatusNotImplemented || r.StatusCode == http.StatusMethodNotAllowed || r.StatusCode == http.StatusForbidden:
		return true
	}
	return false
}

func noUpload(err error) error {
	if err != nil && minio.ToErrorResponse(err).Code == "NoSuchUpload" {
		return fmt.Errorf("%w: %v", ErrNoUpload, err)
	}
	return err
}

type s3Reader struct {
	ctx  context.Context
	s    *S3
	key  string
	size int64
	off  int64
	body io.ReadCloser
}

func (r *s3Reader) Read(p []byte) (int, error) {
	if r.off >= r.size {
		return 0, io.EOF
	}
	if r.body == nil {
		var opts minio.GetObjectOptions
		if err := opts.SetRange(r.off, r.size-1); err != nil {
			return 0, err
		}
		// GetObject with a range returns the body of a 206 directly.
		obj, _, _, err := minio.Core{Client: r.s.c}.GetObject(r.ctx, r.s.bucket, r.key, opts)
		if err != nil {
			return 0, fmt.Errorf("s3 GET %s bytes %d-: %w", r.key, r.off, err)
		}
		r.body = obj
	}
	n, err := r.body.Read(p)
	r.off += int64(n)
	if err == io.EOF && r.off < r.size {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (r *s3Reader) Seek(offset int64, whence int) (int64, error) {
	off, err := seek(r.off, r.size, offset, whence)
	if err != nil {
		return r.off, err
	}
	if off != r.off && r.body != nil {
		r.body.Close()
		r.body = nil
	}
	r.off = off
	return off, nil
}

func (r *s3Reader) Close() error {
	if r.body != nil {
		return r.body.Close()
	}
	return nil
}
