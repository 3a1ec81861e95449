package etcdstore

import (
	"context"
	"testing"

	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/etcdtest"
	"github.com/myriarch/myriarch/lease/internal/rowstore/waketest"
	"github.com/myriarch/myriarch/lease/leasetest"
)

func TestConformance(t *testing.T) {
	srv := etcdtest.Start(t)
	leasetest.Run(t, leasetest.Harness{
		Open: func(t testing.TB, clock lease.Clock) lease.Store {
			return Open(srv.Client(t), Options{Clock: clock})
		},
		Corrupt: func(t testing.TB, id string) {
			if _, err := srv.Client(t).Put(context.Background(), DefaultPrefix+id, `{"owner": 42`); err != nil {
				t.Fatal(err)
			}
		},
	})
}

// A release wakes a standby at once through an etcd watch.
func TestReleaseWakesStandby(t *testing.T) {
	srv := etcdtest.Start(t)
	waketest.ReleaseWakesStandby(t, func(t *testing.T) lease.Store {
		s := Open(srv.Client(t), Options{})
		t.Cleanup(func() { s.Close() })
		return s
	})
}
