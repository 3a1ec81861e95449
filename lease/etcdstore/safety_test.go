package etcdstore

import (
	"testing"
	"time"

	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/etcdtest"
	"github.com/myriarch/myriarch/lease/internal/leasesim"
)

func opener(srv *etcdtest.Server) leasesim.Opener {
	return func(t testing.TB) lease.Store { return Open(srv.Client(t), Options{}) }
}

func outage(srv *etcdtest.Server) *leasesim.Outage {
	return &leasesim.Outage{
		Stop: func(testing.TB) { srv.Stop() },
		Start: func(t testing.TB) {
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
		},
	}
}

func TestKillOwnerInProcess(t *testing.T) {
	t.Parallel()
	leasesim.KillOwner(t, opener(etcdtest.Start(t)))
}

func TestStoreOutage(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	leasesim.StoreOutage(t, opener(srv), *outage(srv))
}

func TestHistoryRandomized(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	leasesim.Randomized(t, opener(srv), outage(srv), 3, 5*time.Second, 3)
}

func TestKillOwnerSubprocess(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	leasesim.KillSubprocess(t, opener(srv), childEndpointEnv+"="+srv.Endpoint)
}
