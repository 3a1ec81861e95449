package pgstore

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/internal/leasesim"
	"go.uber.org/goleak"
)

const childDSNEnv = "PGSTORE_TEST_DSN"

func TestMain(m *testing.M) {
	leasesim.MaybeRunChild(func() (lease.Store, error) {
		return OpenDSN(context.Background(), os.Getenv(childDSNEnv), Options{})
	})
	goleak.VerifyTestMain(m)
}

func opener(dsn string) leasesim.Opener {
	return func(t testing.TB) lease.Store {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s, err := OpenDSN(ctx, dsn, Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
}

func outage(pg *pgtest.Cluster) *leasesim.Outage {
	return &leasesim.Outage{
		Stop: func(t testing.TB) {
			if err := pg.StopServer(context.Background(), "immediate"); err != nil {
				t.Fatal(err)
			}
		},
		Start: func(t testing.TB) {
			if err := pg.StartServer(context.Background()); err != nil {
				t.Fatal(err)
			}
		},
	}
}

func TestKillOwnerInProcess(t *testing.T) {
	t.Parallel()
	leasesim.KillOwner(t, opener(pgtest.New(t).DSN("")))
}

func TestKillOwnerSubprocess(t *testing.T) {
	t.Parallel()
	dsn := pgtest.New(t).DSN("")
	leasesim.KillSubprocess(t, opener(dsn), childDSNEnv+"="+dsn)
}

func TestStoreOutage(t *testing.T) {
	t.Parallel()
	pg := pgtest.New(t)
	leasesim.StoreOutage(t, opener(pg.DSN("")), *outage(pg))
}

func TestHistoryRandomized(t *testing.T) {
	t.Parallel()
	pg := pgtest.New(t)
	leasesim.Randomized(t, opener(pg.DSN("")), outage(pg), 3, 5*time.Second, 2)
}
