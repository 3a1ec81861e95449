package leaderlab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/myriarch/myriarch/pgleader"
)

// envReplica carries the ReplicaSpec of a replica subprocess.
const envReplica = "MYRIARCH_LEADERLAB_REPLICA"

// ReplicaSpec configures a replica subprocess.
type ReplicaSpec struct {
	ID         string `json:"id"`
	PoolDSN    string `json:"pool_dsn"`
	SessionDSN string `json:"session_dsn,omitempty"` // lock session; default PoolDSN
	TMillis    int64  `json:"t_ms"`
	HBMillis   int64  `json:"hb_ms"`
	LockKey    int64  `json:"lock_key"`
	WriteMS    int64  `json:"write_ms"`
	Verbose    bool   `json:"verbose,omitempty"`
}

// Event is one line a replica subprocess prints on stdout.
type Event struct {
	Ev     string `json:"ev"` // ready, elected, demoted, write, fenced, stopped
	Term   int64  `json:"term,omitempty"`
	Reason string `json:"reason,omitempty"`
	PID    int32  `json:"pid,omitempty"` // lock session backend pid (elected)
	At     int64  `json:"at"`            // wall clock, Unix nanoseconds
	Err    string `json:"err,omitempty"`
}

// Time returns At as a time.
func (e Event) Time() time.Time { return time.Unix(0, e.At) }

// MaybeRunReplica runs the replica subprocess and exits when this process
// was started as one (the environment carries a ReplicaSpec); otherwise it
// returns at once. Call it first in TestMain or in an init of the command.
func MaybeRunReplica() {
	v := os.Getenv(envReplica)
	if v == "" {
		return
	}
	os.Exit(runReplica(v))
}

// WritesTable records the fenced writes of the leader jobs of the lab.
const WritesTable = "leaderlab_writes"

const writesSchema = `CREATE TABLE IF NOT EXISTS ` + WritesTable + ` (
	id bigserial PRIMARY KEY,
	lock_key bigint NOT NULL,
	term bigint NOT NULL,
	replica text NOT NULL,
	written_at timestamptz NOT NULL DEFAULT clock_timestamp())`

func runReplica(specJSON string) int {
	var spec ReplicaSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "leaderlab replica:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	out := &emitter{w: bufio.NewWriter(os.Stdout)}
	level := slog.LevelInfo
	if spec.Verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	pcfg, err := pgxpool.ParseConfig(spec.PoolDSN)
	if err != nil {
		logger.Error("pool config", "error", err)
		return 2
	}
	pcfg.MaxConns = 6
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		logger.Error("pool", "error", err)
		return 2
	}
	defer pool.Close()
	var scfg *pgx.ConnConfig
	if spec.SessionDSN != "" {
		if scfg, err = pgx.ParseConfig(spec.SessionDSN); err != nil {
			logger.Error("session config", "error", err)
			return 2
		}
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	var mu sync.Mutex
	var stopWriter context.CancelFunc = func() {}
	defer func() { mu.Lock(); stopWriter(); mu.Unlock() }()
	e, err := pgleader.New(pgleader.Config{
		Pool:                 pool,
		SessionConfig:        scfg,
		LeaderSessionTimeout: time.Duration(spec.TMillis) * time.Millisecond,
		HeartbeatInterval:    time.Duration(spec.HBMillis) * time.Millisecond,
		LockKey:              spec.LockKey,
		ID:                   spec.ID,
		Version:              "leaderlab",
		Logger:               logger,
		OnElected: func(l *pgleader.Leadership) {
			term := l.Term()
			at := time.Now().UnixNano()
			out.emit(Event{Ev: "elected", Term: term, PID: lockPID(ctx, pool, spec.LockKey), At: at})
			// The writer deliberately ignores the leader context and keeps
			// the term it was elected with: it plays a job that did not
			// notice the end of its leadership (a frozen process that
			// wakes up). Only the database fence stops its writes.
			mu.Lock()
			defer mu.Unlock()
			stopWriter()
			wctx, cancel := context.WithCancel(ctx)
			stopWriter = cancel
			wg.Go(func() { writer(wctx, pool, spec, term, out) })
		},
		OnDemoted: func(term int64, reason string) {
			out.emit(Event{Ev: "demoted", Term: term, Reason: reason})
		},
	})
	if err != nil {
		logger.Error("elector", "error", err)
		return 2
	}
	// Commands on stdin: "crash" exits at once without releasing anything
	// (the operating system closes the sockets).
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if sc.Text() == "crash" {
				os.Exit(3)
			}
		}
	}()
	out.emit(Event{Ev: "ready"})
	if err := e.Run(ctx); err != nil {
		logger.Error("run", "error", err)
		return 1
	}
	out.emit(Event{Ev: "stopped"})
	return 0
}

// lockPID is the backend pid of the lock session that started the current
// term of key (0 when it cannot be read).
func lockPID(ctx context.Context, pool *pgxpool.Pool, key int64) int32 {
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r, _, _ := pgleader.CurrentTerm(qctx, pool, key)
	return r.LockPID
}

func writer(ctx context.Context, pool *pgxpool.Pool, spec ReplicaSpec, term int64, out *emitter) {
	every := time.Duration(spec.WriteMS) * time.Millisecond
	t := time.NewTicker(every)
	defer t.Stop()
	lastFenced := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := pgx.BeginFunc(wctx, pool, func(tx pgx.Tx) error {
			if err := pgleader.CheckTerm(wctx, tx, spec.LockKey, term); err != nil {
				return err
			}
			_, err := tx.Exec(wctx, "INSERT INTO "+WritesTable+" (lock_key, term, replica) VALUES ($1, $2, $3)", spec.LockKey, term, spec.ID)
			return err
		})
		cancel()
		switch {
		case err == nil:
			out.emit(Event{Ev: "write", Term: term})
		case errors.Is(err, pgleader.ErrStaleTerm):
			if time.Since(lastFenced) > 500*time.Millisecond {
				out.emit(Event{Ev: "fenced", Term: term, Err: err.Error()})
				lastFenced = time.Now()
			}
		case ctx.Err() == nil:
			out.emit(Event{Ev: "write_error", Term: term, Err: err.Error()})
		}
	}
}

type emitter struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (o *emitter) emit(e Event) {
	if e.At == 0 {
		e.At = time.Now().UnixNano()
	}
	b, _ := json.Marshal(e)
	o.mu.Lock()
	defer o.mu.Unlock()
	_, _ = o.w.Write(append(b, '\n'))
	_ = o.w.Flush()
}
