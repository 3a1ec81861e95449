package blobstore

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ReadChunk is the most one query reads from a large object.
const ReadChunk = 256 << 10

// PG is the PostgreSQL large-object store.
type PG struct{ Pool *pgxpool.Pool }

// Kind is KindPG.
func (PG) Kind() string { return KindPG }

// Open reads the large object one chunk per query (lo_get), so that a
// download holds a pool connection only while a chunk is read, not while
// a slow agent receives the whole artifact.
func (p PG) Open(ctx context.Context, r Ref) (io.ReadSeekCloser, error) {
	return &loReader{ctx: ctx, pool: p.Pool, oid: r.OID, size: r.Size}, nil
}

// Remove unlinks the large object in tx.
func (PG) Remove(ctx context.Context, tx pgx.Tx, r Ref) error {
	if r.OID == 0 {
		return nil
	}
	los := tx.LargeObjects()
	return los.Unlink(ctx, r.OID)
}

type loReader struct {
	ctx  context.Context
	pool *pgxpool.Pool
	oid  uint32
	size int64
	off  int64
}

func (l *loReader) Read(p []byte) (int, error) {
	if l.off >= l.size {
		return 0, io.EOF
	}
	n := min(int64(len(p)), l.size-l.off, ReadChunk)
	var b []byte
	if err := l.pool.QueryRow(l.ctx, `SELECT lo_get($1, $2, $3)`, l.oid, l.off, int32(n)).Scan(&b); err != nil {
		return 0, fmt.Errorf("reading bytes %d to %d: %w", l.off, l.off+n, err)
	}
	if len(b) == 0 {
		return 0, io.ErrUnexpectedEOF
	}
	k := copy(p, b)
	l.off += int64(k)
	return k, nil
}

func (l *loReader) Seek(offset int64, whence int) (int64, error) {
	off, err := seek(l.off, l.size, offset, whence)
	if err == nil {
		l.off = off
	}
	return off, err
}

func (l *loReader) Close() error { return nil }

func seek(cur, size, offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += cur
	case io.SeekEnd:
		offset += size
	default:
		return 0, errors.New("seek: bad whence")
	}
	if offset < 0 {
		return 0, errors.New("seek: negative position")
	}
	return offset, nil
}
