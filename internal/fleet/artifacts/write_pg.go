package artifacts

import (
	"context"
	"encoding"
	"hash"
	"io"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgWriter writes blobs into PostgreSQL large objects.
type pgWriter struct {
	pool *pgxpool.Pool
	// segmentSize bytes are committed at once (Options.SegmentSize).
	segmentSize int64
	m           *metrics
}

// write writes the source into the claim's large object in segments of
// segmentSize, each committed with the bytes and hash state after it.
func (p pgWriter) write(ctx context.Context, a *attempt, src source, h hash.Hash) (string, int64, error) {
	n := src.from
	buf := make([]byte, ChunkSize)
	for {
		eof, err := p.segment(ctx, a, src, h, buf, &n)
		if err != nil {
			return "", n, err
		}
		if eof {
			return "", n, nil
		}
	}
}

// segment writes up to segmentSize bytes in one transaction. It does not
// hold the term row while it reads the source (a slow source would delay
// the next election); it checks at commit, under the download row's lock,
// that the download is still this term's.
func (p pgWriter) segment(ctx context.Context, a *attempt, src source, h hash.Hash, buf []byte, n *int64) (eof bool, err error) {
	w, c := a.w, a.c
	a.reason = "store"
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	los := tx.LargeObjects()
	obj, err := los.Open(ctx, c.oid, pgx.LargeObjectModeWrite)
	if err != nil {
		return false, err
	}
	// Bytes past the committed ones are from an attempt that did not
	// commit, or of content that changed: cut them.
	if err := obj.Truncate(*n); err != nil {
		return false, err
	}
	if _, err := obj.Seek(*n, io.SeekStart); err != nil {
		return false, err
	}
	start := *n
	for *n-start < p.segmentSize {
		k, rerr := io.ReadFull(src.body, buf)
		if k > 0 {
			h.Write(buf[:k])
			if _, err := obj.Write(buf[:k]); err != nil {
				return false, err
			}
			if err := a.count(p.m, n, k); err != nil {
				return false, err
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			eof = true
			break
		}
		if rerr != nil {
			a.reason = "source"
			return false, rerr
		}
	}
	if err := obj.Close(); err != nil {
		return false, err
	}
	st, err := h.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		return false, err
	}
	if err := owns(ctx, tx, w.Digest, c.term); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `UPDATE artifact_downloads SET written = $2, bytes = $2, hash_state = $3, source_etag = $4, source_last_modified = $5,
		resumed_from = $6, updated_at = now() WHERE digest = $1`, w.Digest, *n, st, src.etag, src.lastMod, src.from); err != nil {
		return false, err
	}
	return eof, tx.Commit(ctx)
}
