package etcdstore

import (
	"testing"

	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/etcdtest"
	"github.com/myriarch/myriarch/lease/internal/leasesim"
)

func BenchmarkStore(b *testing.B) {
	srv := etcdtest.Start(b)
	leasesim.BenchStore(b, func(b *testing.B) lease.Store { return Open(srv.Client(b), Options{}) })
}
