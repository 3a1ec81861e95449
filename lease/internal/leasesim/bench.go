package leasesim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/lease"
)

// BenchStore measures one store: renew latency, acquire latency (granting
// a released row, and observing a held one), and renewals per second one
// process sustains with many sessions renewing concurrently.
func BenchStore(b *testing.B, open func(b *testing.B) lease.Store) {
	ctx := context.Background()
	const ttl = 45 * time.Second
	b.Run("Renew", func(b *testing.B) {
		s := open(b)
		id := fmt.Sprintf("bench-renew-%d", time.Now().UnixNano())
		tok, err := s.Acquire(ctx, lease.Claim{ID: id, Owner: "o", TTL: ttl})
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for b.Loop() {
			if err := s.Renew(ctx, id, tok, ttl); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("AcquireReleased", func(b *testing.B) {
		s := open(b)
		id := fmt.Sprintf("bench-acq-%d", time.Now().UnixNano())
		var tok lease.Token
		var acq time.Duration
		n := 0
		for b.Loop() {
			t0 := time.Now()
			var err error
			tok, err = s.Acquire(ctx, lease.Claim{ID: id, Owner: "o", TTL: ttl})
			acq += time.Since(t0)
			n++
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Release(ctx, id, tok); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(acq.Nanoseconds())/float64(n), "acquire-ns/op")
	})
	b.Run("AcquireObserveHeld", func(b *testing.B) {
		s := open(b)
		id := fmt.Sprintf("bench-obs-%d", time.Now().UnixNano())
		if _, err := s.Acquire(ctx, lease.Claim{ID: id, Owner: "holder", TTL: time.Hour}); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for b.Loop() {
			if _, err := s.Acquire(ctx, lease.Claim{ID: id, Owner: "observer", TTL: time.Hour}); !errors.Is(err, lease.ErrHeld) {
				b.Fatal(err)
			}
		}
	})
	b.Run("RenewalsPerSecond", func(b *testing.B) {
		s := open(b)
		const sessions = 64
		toks := make([]lease.Token, sessions)
		ids := make([]string, sessions)
		base := time.Now().UnixNano()
		for i := range ids {
			ids[i] = fmt.Sprintf("bench-rps-%d-%d", base, i)
			var err error
			if toks[i], err = s.Acquire(ctx, lease.Claim{ID: ids[i], Owner: "o", TTL: ttl}); err != nil {
				b.Fatal(err)
			}
		}
		var next atomic.Int64
		b.SetParallelism(sessions / runtime.GOMAXPROCS(0))
		start := time.Now()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := int(next.Add(1)-1) % sessions
			for pb.Next() {
				if err := s.Renew(ctx, ids[i], toks[i], ttl); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "renewals/s")
	})
}

// BenchSessions runs n exclusive sessions in one process at cadence c for
// dur, first as owners of all n and then with n standbys (another
// instance in the same process) polling against them, and reports this
// process's CPU (user+system, in cores) and memory.
//
// serverCPU, if not nil, reads the CPU time the store's server has used so
// far; its share is reported too.
func BenchSessions(b *testing.B, open func(b *testing.B) lease.Store, n int, c failover.Cadence, dur time.Duration, serverCPU func() time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := open(b)
	base := time.Now().UnixNano()
	var owners atomic.Int64
	startGroup := func(instance string) {
		for i := range n {
			m, err := lease.New(lease.Config{Store: s, Session: fmt.Sprintf("bench-1k-%d-%d", base, i), Owner: instance + "#bench",
				Cadence: c, Logger: quiet,
				OnOwner: func(own *lease.Ownership) { owners.Add(1); <-own.Context().Done(); owners.Add(-1) }})
			if err != nil {
				b.Fatal(err)
			}
			wg.Go(func() { _ = m.Run(ctx) })
		}
	}
	measure := func(label string) {
		runtime.GC()
		var ms0 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		ru0 := rusage()
		var srv0 time.Duration
		if serverCPU != nil {
			srv0 = serverCPU()
		}
		t0 := time.Now()
		time.Sleep(dur)
		cpu := rusage() - ru0
		wall := time.Since(t0)
		if serverCPU != nil {
			srv := serverCPU() - srv0
			b.Logf("%s: store server CPU %.3f cores", label, srv.Seconds()/wall.Seconds())
			b.ReportMetric(srv.Seconds()/wall.Seconds(), label+"-server-cpu-cores")
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		b.Logf("%s: %d sessions, %d owned, over %v: CPU %.3f cores (%.1f µs CPU per session-second), heap in use %.1f MiB, sys %.1f MiB, goroutines %d",
			label, n, owners.Load(), wall.Round(time.Second), cpu.Seconds()/wall.Seconds(),
			cpu.Seconds()/wall.Seconds()/float64(n)*1e6, float64(ms.HeapInuse)/(1<<20), float64(ms.Sys)/(1<<20), runtime.NumGoroutine())
		b.ReportMetric(cpu.Seconds()/wall.Seconds(), label+"-cpu-cores")
		b.ReportMetric(float64(ms.HeapInuse)/(1<<20), label+"-heap-MiB")
	}
	b.ResetTimer()
	startGroup("owner")
	end := time.Now().Add(2 * time.Minute)
	for owners.Load() < int64(n) {
		if time.Now().After(end) {
			b.Fatalf("only %d of %d sessions owned after 2 minutes", owners.Load(), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.Logf("all %d sessions owned", n)
	measure("owners")
	startGroup("standby")
	measure("owners+standbys")
	if got := owners.Load(); got != int64(n) {
		b.Fatalf("%d owners with standbys running, want %d", got, n)
	}
}

func rusage() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
