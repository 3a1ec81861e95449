package pgstore

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
	c, _, err := failover.ResolveCadence(failover.LeaseConfig{Baseline: failover.Baseline{Name: "clustered", LeaseTTL: 45 * time.Second,
		RenewInterval: 10 * time.Second, LeaseRenewJitter: time.Second, RenewCallTimeout: 3 * time.Second, StepDownGrace: 5 * time.Second}})
	if err != nil {
		b.Fatal(err)
	}
	pg := pgtest.New(b)
	dsn := pg.DSN("") + "&pool_max_conns=8"
	for b.Loop() {
		leasesim.BenchSessions(b, benchOpener(dsn), 1000, c, 30*time.Second, func() time.Duration { return serverCPU(pg) })
	}
}

// serverCPU sums the CPU time of the cluster's postmaster and its
// children (backends) from /proc. Exited backends are not counted.
func serverCPU(pg *pgtest.Cluster) time.Duration {
	data, err := os.ReadFile(filepath.Join(pg.Dir(), "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	pm, _ := strconv.Atoi(strings.SplitN(string(data), "\n", 2)[0])
	ents, _ := os.ReadDir("/proc")
	var ticks int64
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the ")" of the command: state ppid ... utime(14) stime(15).
		f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:]))
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		if pid != pm && ppid != pm {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		stt, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += ut + stt
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}
