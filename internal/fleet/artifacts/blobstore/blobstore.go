// Package blobstore holds the verified artifact blobs that myriarchd's
// replicas serve to agents: PostgreSQL large objects (the default, which
// needs nothing besides the database) or an S3-compatible object store.
//
// The database stays the single source of truth: a blob is servable only
// while its artifact_blobs row exists, and that row is inserted only after
// the bytes are completely stored and their digest verified, in a
// term-fenced transaction. Whatever a store holds without such a row (a
// partial large object of an abandoned download, an object uploaded by a
// leader that lost its term) is garbage that the prefetcher's retention
// removes.
package blobstore

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"
)

// Kinds of store, as recorded in artifact_blobs.store.
const (
	KindPG = "pg"
	KindS3 = "s3"
)

// Ref locates one stored blob: the store kind and its address there.
type Ref struct {
	Kind string
	// OID is the large object of a blob in PostgreSQL.
	OID uint32
	// Key is the object key of a blob in S3.
	Key  string
	Size int64
}

// Store reads and removes blobs of one kind. Writing differs by kind (the
// large objects are written in fenced segments, the objects in the parts of
// a multipart upload, each recorded as it completes) and is done by the
// prefetcher.
type Store interface {
	// Kind is the store's kind (KindPG, KindS3).
	Kind() string
	// Open returns the blob's content; Seek is cheap (no I/O until the
	// next Read), so http.ServeContent can answer Range requests.
	Open(ctx context.Context, r Ref) (io.ReadSeekCloser, error)
	// Remove deletes the blob's bytes. tx is the fenced transaction that
	// deletes the blob's row: PostgreSQL unlinks the large object in it;
	// other stores delete after it commits (see Committed).
	Remove(ctx context.Context, tx pgx.Tx, r Ref) error
}

// Set is the stores a replica serves from, by kind.
type Set map[string]Store

// NewSet returns the set of the given stores (nil ones are skipped).
func NewSet(stores ...Store) Set {
	s := Set{}
	for _, st := range stores {
		if st != nil {
			s[st.Kind()] = st
		}
	}
	return s
}

// ErrNoStore is returned for a blob of a kind this replica has no store for
// (for example an S3 blob after the S3 settings were removed).
var ErrNoStore = errors.New("no store configured for this blob")

// Open opens r in the store of its kind.
func (s Set) Open(ctx context.Context, r Ref) (io.ReadSeekCloser, error) {
	st, ok := s[r.Kind]
	if !ok {
		return nil, fmt.Errorf("blob in store %q: %w", r.Kind, ErrNoStore)
	}
	return st.Open(ctx, r)
}
