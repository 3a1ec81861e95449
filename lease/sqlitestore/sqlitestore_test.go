package sqlitestore

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/internal/rowstore/waketest"
	"github.com/myriarch/myriarch/lease/leasetest"
)

func harness(t *testing.T) leasetest.Harness {
	path := filepath.Join(t.TempDir(), "leases.db")
	return leasetest.Harness{
		Open: func(t testing.TB, clock lease.Clock) lease.Store {
			s, err := Open(context.Background(), path, Options{Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Corrupt: func(t testing.TB, id string) {
			db, err := sql.Open("sqlite", dsn(path, 5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if _, err := db.Exec("UPDATE myriarch_leases SET version = -7 WHERE id = ?", id); err != nil {
				t.Fatal(err)
			}
		},
	}
}

func TestConformance(t *testing.T) { leasetest.Run(t, harness(t)) }

// A release wakes a standby process on the same host at once.
func TestReleaseWakesStandby(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	waketest.ReleaseWakesStandby(t, func(t *testing.T) lease.Store {
		s, err := Open(context.Background(), path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}
