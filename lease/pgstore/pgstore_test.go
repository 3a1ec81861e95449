package pgstore

import (
	"context"
	"testing"

	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/leasetest"
)

func TestConformance(t *testing.T) {
	pg := pgtest.New(t)
	dsn := pg.DSN("")
	leasetest.Run(t, leasetest.Harness{
		Open: func(t testing.TB, clock lease.Clock) lease.Store {
			s, err := OpenDSN(context.Background(), dsn, Options{Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Corrupt: func(t testing.TB, id string) {
			if out, err := pg.Psql(context.Background(), "UPDATE myriarch_leases SET expiry_ns = renewed_at_ns - 1 WHERE id = '"+id+"'"); err != nil {
				t.Fatal(err, out)
			}
		},
	})
}
