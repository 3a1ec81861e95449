package artifacts

import (
	"context"
	"fmt"
	"hash"
	"sync/atomic"
)

// blobWriter streams the content of a download into one kind of blob
// store, committing its progress in the download's row as it goes (under
// the row's term, see owns) so that a new leader continues it. It returns
// the object key (S3; "" for PostgreSQL, whose large object is the
// claim's) and the bytes of the content.
type blobWriter interface {
	write(ctx context.Context, a *attempt, src source, h hash.Hash) (key string, n int64, err error)
}

// attempt is one attempt at a download as its parts share it.
type attempt struct {
	w want
	c *claim
	// done is the bytes so far, read by the progress reporter.
	done atomic.Int64
	// reason is the failure reason label of an error (source, store, size,
	// digest, signature).
	reason string
}

// count records k more bytes of the content, *n after them: the progress,
// the metrics, and the recorded size as the bound.
func (a *attempt) count(m *metrics, n *int64, k int) error {
	*n += int64(k)
	a.done.Store(*n)
	m.bytes.Add(float64(k))
	m.curBytes.WithLabelValues(a.w.Digest).Set(float64(*n))
	if a.w.Size >= 0 && *n > a.w.Size {
		a.reason = "size"
		return fmt.Errorf("more than the recorded size of %d bytes", a.w.Size)
	}
	return nil
}
