package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/internal/leasesim"
)

func benchOpener(dsn string) func(b *testing.B) lease.Store {
	return func(b *testing.B) lease.Store {
		s, err := OpenDSN(context.Background(), dsn, Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s
	}
}

func BenchmarkStore(b *testing.B) {
	leasesim.BenchStore(b, benchOpener(pgtest.New(b).DSN("")))
}

// BenchmarkSessions1000Clustered runs 1,000 exclusive sessions in one
// process on one pool at the clustered profile (TTL 45s, renew 10s ± 0.5s,
// poll 5s ± 25%) and reports CPU and memory. Run with -benchtime=1x.
func BenchmarkSessions1000Clustered(b *testing.B) {
	c, _, err := failover.ResolveCadence(failover.LeaseConfig{DeploymentMode: failover.Clustered})
	if err != nil {
		b.Fatal(err)
	}
	dsn := pgtest.New(b).DSN("") + "&pool_max_conns=8"
	for b.Loop() {
		leasesim.BenchSessions(b, benchOpener(dsn), 1000, c, 30*time.Second)
	}
}
