package pgleader_test

import (
	"context"
	"errors"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/myriarch/myriarch/pgleader"
)

// A replica runs the election next to its other work; the singleton jobs
// run under the leader context and write only through InTerm.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://myriarch@db/myriarch")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	e, err := pgleader.New(pgleader.Config{
		Pool:       pool,
		Version:    "1.4.0",
		Registerer: prometheus.DefaultRegisterer,
		OnElected: func(l *pgleader.Leadership) {
			go func() { // a singleton job; it ends with the term
				err := l.InTerm(l.Context(), func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "UPDATE rollouts SET state = 'running' WHERE id = $1", 7)
					return err
				})
				if errors.Is(err, pgleader.ErrStaleTerm) {
					return // the term is over; another replica leads now
				}
			}()
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop() // planned stop: unlock and close within 4s
	go func() { _ = e.Run(runCtx) }()
}
