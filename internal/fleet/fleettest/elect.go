package fleettest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/myriarch/myriarch/pgleader"
)

// Elect runs an elector with id on pool until it is elected and returns its
// term's Leadership (whose InTerm and Fence are what a leader job writes
// through) and a stop that ends the elector and waits for it.
func Elect(pool *pgxpool.Pool, id string) (*pgleader.Leadership, func(), error) {
	elected := make(chan *pgleader.Leadership, 1)
	el, err := pgleader.New(pgleader.Config{Pool: pool, LeaderSessionTimeout: 10 * time.Second, ID: id,
		OnElected: func(l *pgleader.Leadership) {
			select {
			case elected <- l:
			default:
			}
		}})
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = el.Run(ctx) })
	stop := func() { cancel(); wg.Wait() }
	select {
	case l := <-elected:
		return l, stop, nil
	case <-time.After(time.Minute):
		stop()
		return nil, nil, fmt.Errorf("elector %s not elected within a minute", id)
	}
}
