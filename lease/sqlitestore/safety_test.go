package sqlitestore

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/internal/leasesim"
	"go.uber.org/goleak"
)

const childPathEnv = "SQLITESTORE_TEST_PATH"

func TestMain(m *testing.M) {
	leasesim.MaybeRunChild(func() (lease.Store, error) {
		return Open(context.Background(), os.Getenv(childPathEnv), Options{})
	})
	goleak.VerifyTestMain(m)
}

func opener(t *testing.T) (leasesim.Opener, string) {
	path := filepath.Join(t.TempDir(), "leases.db")
	return func(t testing.TB) lease.Store {
		s, err := Open(context.Background(), path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}, path
}

func TestKillOwnerInProcess(t *testing.T) {
	t.Parallel()
	open, _ := opener(t)
	leasesim.KillOwner(t, open)
}

// TestKillOwnerSubprocess shares one SQLite file between two processes.
func TestKillOwnerSubprocess(t *testing.T) {
	t.Parallel()
	open, path := opener(t)
	leasesim.KillSubprocess(t, open, childPathEnv+"="+path)
}

func TestHistoryRandomized(t *testing.T) {
	t.Parallel()
	open, _ := opener(t)
	leasesim.Randomized(t, open, nil, 3, 5*time.Second, 1)
}
