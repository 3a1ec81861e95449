package artifacts

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore"
)

// s3Writer writes blobs into an S3-compatible store.
type s3Writer struct {
	s3   *blobstore.S3
	pool *pgxpool.Pool
	// partSize is the size of one part of a multipart upload
	// (Options.S3PartSize): what one upload buffers.
	partSize int64
	m        *metrics
}

// write uploads the source in the parts of a multipart upload, each
// recorded once the store has it with the bytes and the hash state after
// it, so that a new leader continues the upload. A blob that fits in one
// part is uploaded with one PUT (nothing worth continuing). It returns the
// object key.
func (p s3Writer) write(ctx context.Context, a *attempt, src source, h hash.Hash) (string, int64, error) {
	w, c := a.w, a.c
	n := src.from
	buf := make([]byte, p.partSize)
	for {
		k, eof, err := p.fill(buf, src.body, h, a, &n)
		if err != nil {
			return c.key, n, err
		}
		if eof && c.uploadID == "" {
			key := p.s3Key(w, c.term)
			a.reason = "store"
			if err := p.s3.Put(ctx, key, bytes.NewReader(buf[:k]), int64(k)); err != nil {
				_ = p.s3.Delete(context.WithoutCancel(ctx), key)
				return "", n, fmt.Errorf("uploading to %s: %w", p.s3, err)
			}
			return key, n, nil
		}
		if k > 0 {
			if err := p.putPart(ctx, a, buf[:k], n, h, src); err != nil {
				return c.key, n, err
			}
		}
		if eof {
			return c.key, n, nil
		}
	}
}

// s3Key is the key of a new upload: every upload its own, so that one of a
// leader that lost its term never overwrites a servable object.
func (p s3Writer) s3Key(w want, term int64) string {
	var nonce [6]byte
	_, _ = rand.Read(nonce[:])
	return p.s3.Key(w.Digest, fmt.Sprintf("t%d-%s", term, hex.EncodeToString(nonce[:])))
}

// fill reads the next part into buf (until it is full or the source ends),
// hashing and counting as it goes.
func (p s3Writer) fill(buf []byte, r io.Reader, h hash.Hash, a *attempt, n *int64) (k int, eof bool, err error) {
	for k < len(buf) {
		m, rerr := r.Read(buf[k:min(len(buf), k+ChunkSize)])
		if m > 0 {
			h.Write(buf[k : k+m])
			k += m
			if err := a.count(p.m, n, m); err != nil {
				return k, false, err
			}
		}
		if rerr == io.EOF {
			return k, true, nil
		}
		if rerr != nil {
			a.reason = "source"
			return k, false, rerr
		}
	}
	return k, false, nil
}

// putPart uploads b as the next part (starting the upload with the first
// one) and records it with the bytes n and the hash state after it. The
// record commits only while the download is still this term's, checked
// under the row lock as for a segment of a large object.
func (p s3Writer) putPart(ctx context.Context, a *attempt, b []byte, n int64, h hash.Hash, src source) error {
	w, c := a.w, a.c
	a.reason = "store"
	if c.uploadID == "" {
		c.key = p.s3Key(w, c.term)
		id, err := p.s3.NewUpload(ctx, c.key)
		if err != nil {
			return fmt.Errorf("uploading to %s: starting a multipart upload: %w", p.s3, err)
		}
		c.uploadID = id
	}
	part, err := p.s3.PutPart(ctx, c.key, c.uploadID, len(c.parts)+1, b)
	if err != nil {
		return fmt.Errorf("uploading to %s: part %d: %w", p.s3, len(c.parts)+1, err)
	}
	c.parts = append(c.parts, part)
	st, err := h.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		return err
	}
	parts, err := json.Marshal(c.parts)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if err := owns(ctx, tx, w.Digest, c.term); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE artifact_downloads SET written = $2, bytes = $2, hash_state = $3, source_etag = $4, source_last_modified = $5,
			resumed_from = $6, s3_key = $7, s3_upload_id = $8, s3_parts = $9, updated_at = now() WHERE digest = $1`,
			w.Digest, n, st, src.etag, src.lastMod, src.from, c.key, c.uploadID, parts)
		return err
	})
}

// complete makes the claim's verified multipart upload an object.
func (p s3Writer) complete(ctx context.Context, c *claim) error {
	if err := p.s3.CompleteUpload(ctx, c.key, c.uploadID, c.parts); err != nil {
		return fmt.Errorf("completing upload %s of %s in %s: %w", c.uploadID, c.key, p.s3, err)
	}
	return nil
}

// discard deletes the object of a single PUT that no blob row names (a
// failure is left to retention's sweep).
func (p s3Writer) discard(ctx context.Context, key string) {
	_ = p.s3.Delete(context.WithoutCancel(ctx), key)
}
