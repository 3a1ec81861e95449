package sqlitestore

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/internal/leasesim"
)

func BenchmarkStore(b *testing.B) {
	path := filepath.Join(b.TempDir(), "leases.db")
	leasesim.BenchStore(b, func(b *testing.B) lease.Store {
		s, err := Open(context.Background(), path, Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s
	})
}
