package pgstore

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/internal/rowstore/waketest"
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

func TestRefusesAsynchronousCommit(t *testing.T) {
	pg := pgtest.New(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := Open(ctx, pool, Options{}); err == nil || !strings.Contains(err.Error(), "synchronous_commit") {
		t.Fatalf("Open on a pool with synchronous_commit off: %v", err)
	}
}

// A release wakes a standby at once through LISTEN/NOTIFY.
func TestReleaseWakesStandby(t *testing.T) {
	pg := pgtest.New(t)
	waketest.ReleaseWakesStandby(t, func(t *testing.T) lease.Store {
		s, err := OpenDSN(context.Background(), pg.DSN(""), Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}
