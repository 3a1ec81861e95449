package lease_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/sqlitestore"
	"github.com/prometheus/client_golang/prometheus"
)

// A process competes for one exclusive session on the embedded store and
// does its work only while it owns the lease, stamping the work with the
// fencing version.
func ExampleManager() {
	dir, _ := os.MkdirTemp("", "lease-example")
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	store, err := sqlitestore.Open(ctx, filepath.Join(dir, "leases.db"), sqlitestore.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()

	// The cadence comes from the operator's lease block, resolved exactly
	// as the failover budgets are computed.
	cadence, _, err := failover.ResolveCadence(failover.LeaseConfig{
		LeaseTTL: 5 * time.Second, RenewInterval: time.Second, RenewCallTimeout: 500 * time.Millisecond,
		AcquirePollInterval: 250 * time.Millisecond, StepDownGrace: time.Second,
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	worked := make(chan struct{})
	m, err := lease.New(lease.Config{
		Store:      store,
		Session:    "route-orders",
		InstanceID: "bridge-0",
		Cadence:    cadence,
		Registerer: prometheus.NewRegistry(),
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnOwner: func(own *lease.Ownership) {
			// Act only while the tenure is valid; stop on Stopping or
			// when the context ends.
			if own.Valid() {
				fmt.Println("owner, fencing version", own.Token().Version)
			}
			close(worked)
			select {
			case <-own.Stopping():
			case <-own.Context().Done():
			}
		},
		CloseSource: func(context.Context) error {
			fmt.Println("source closed")
			return nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()

	<-worked
	cancel() // shutdown: step down in three bounded phases and release
	fmt.Println("Run returned:", <-done)

	rec, _ := store.Current(context.Background(), "route-orders")
	fmt.Printf("owner after release: %q, version kept: %d\n", rec.Owner, rec.Version)
	// Output:
	// owner, fencing version 1
	// source closed
	// Run returned: <nil>
	// owner after release: "", version kept: 1
}
