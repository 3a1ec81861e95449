package proof

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/lab"
	"github.com/myriarch/myriarch/internal/leaderlab"
)

// netnsMu serializes the leader lab's network-drop rounds: their network
// namespaces and addresses have fixed names.
var netnsMu sync.Mutex

// runBatch runs one batch in dir/work/bNNNNN and returns its records. The
// batch's logs stay (moved to dir/failed/bNNNNN) when a round did not
// pass; otherwise they are removed. An error is returned only for what
// stops the campaign (the report directory cannot be written).
func runBatch(ctx context.Context, dir string, b Batch, o Options) ([]Record, error) {
	name := fmt.Sprintf("b%05d", b.Index)
	work := filepath.Join(dir, "work", name)
	if err := os.RemoveAll(work); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	specs := make([]Spec, b.N)
	for i := range specs {
		s, err := Decode(Seed(b.Base, b.First+i))
		if err != nil {
			return nil, err
		}
		specs[i] = s
	}
	start := time.Now()
	// A lab run that ends early (a pair that does not stabilize) leaves
	// the rest of the batch to a fresh set-up in the same directory.
	var recs []Record
	for len(recs) < len(specs) {
		part := specs[len(recs):]
		var rs []Record
		var err error
		if part[0].Kind == KindLeader {
			rs, err = runLeader(ctx, work, b, part, o)
		} else {
			rs, err = runBridge(ctx, work, b, part, o)
		}
		if err != nil {
			return nil, err
		}
		if len(rs) == 0 {
			break
		}
		recs = append(recs, rs...)
	}
	keep := false
	load := Load1()
	for i := range recs {
		recs[i].BatchDurationS = round3(time.Since(start).Seconds())
		recs[i].Load1 = load
		if recs[i].Verdict != Pass && recs[i].Verdict != Skipped {
			keep = true
		}
	}
	if ctx.Err() != nil {
		_ = os.RemoveAll(work)
		return nil, ctx.Err()
	}
	if !keep {
		return recs, os.RemoveAll(work)
	}
	kept := filepath.Join(dir, "failed", name)
	if err := os.MkdirAll(filepath.Dir(kept), 0o755); err != nil {
		return nil, err
	}
	_ = os.RemoveAll(kept)
	pruneData(work)
	if err := os.Rename(work, kept); err != nil {
		return nil, err
	}
	rel, _ := filepath.Rel(dir, kept)
	for i := range recs {
		if recs[i].Verdict != Pass {
			recs[i].LogDir = rel
		}
	}
	return recs, nil
}

// pruneData removes store data (etcd's preallocated WAL, databases) from
// a kept batch, leaving the logs.
func pruneData(work string) {
	_ = filepath.WalkDir(work, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), "etcd-") {
			_ = os.RemoveAll(p)
			return filepath.SkipDir
		}
		if !d.IsDir() && (strings.HasSuffix(p, ".db") || strings.HasSuffix(p, ".db-wal") || strings.HasSuffix(p, ".db-shm")) {
			_ = os.Remove(p)
		}
		return nil
	})
}

// roundOf is a round's index in its batch, from its seed.
func roundOf(seed int64) int { return int(seed & (1<<roundBits - 1)) }

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

// Load1 is the 1-minute load average (/proc/loadavg), 0 where unknown.
func Load1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _, _ := strings.Cut(string(b), " ")
	v, _ := strconv.ParseFloat(f, 64)
	return v
}

func faultsOf(sc string) []string { return strings.Split(sc, "+") }

// runBridge runs a bridge batch: one lab.Run with a plan of its rounds.
func runBridge(ctx context.Context, work string, b Batch, specs []Spec, o Options) ([]Record, error) {
	s0 := specs[0]
	logf, err := os.OpenFile(filepath.Join(work, "lab.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "batch %d: store %s, broker %s, rate %d, seeds %d..%d\n", b.Index, s0.Store, s0.Broker, s0.Rate, s0.Seed, specs[len(specs)-1].Seed)
	plan := make([]lab.Planned, len(specs))
	for i, s := range specs {
		plan[i] = s.Planned()
		fmt.Fprintf(logf, "  round %d seed %d: %s after %v (second %v, blip %v)\n", i, s.Seed, s.Scenario, s.Delay, s.Second, s.Blip)
	}
	opts := lab.Options{Command: o.BridgeCommand, Rate: s0.Rate, Dir: work, Progress: logf, Store: s0.Store, Plan: plan}
	if s0.Broker == BrokerMosquitto {
		mdir := filepath.Join(work, "mosquitto")
		if err := os.MkdirAll(mdir, 0o755); err != nil {
			return nil, err
		}
		m, err := lab.StartMosquitto(ctx, mdir, MosquittoQueue)
		if err != nil {
			return setupFailed(b, specs, "mosquitto: "+err.Error()), nil
		}
		defer m.Close()
		opts.Broker = m.URL
	}
	rep, runErr := lab.Run(ctx, opts)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if rep == nil {
		return setupFailed(b, specs, "lab: "+runErr.Error()), nil
	}
	var recs []Record
	for _, r := range rep.Scenarios {
		s := specs[r.Round]
		rec := Record{Seed: s.Seed, Kind: KindBridge, Batch: b.Index, Round: roundOf(s.Seed), Store: s.Store, Broker: s.Broker, Rate: s.Rate,
			Scenario: s.Scenario, Faults: faultsOf(s.Scenario), DelayS: round3(s.Delay.Seconds()),
			FailureToFullS: round3(r.FailureToFullS), FirstDeliveryS: round3(r.FaultToFirstDeliveryS), BudgetS: r.BudgetS,
			OverBudget: !r.WithinBudget, Published: r.MessagesPublished, Lost: r.Lost, LostIDs: r.LostIDs, Duplicates: r.Duplicates,
			DuplicateBound: r.DuplicateBound, Stale: r.StaleDeliveries, TwoOwners: r.TwoOwners || len(rep.StoreAnomalies) > 0,
			StoreAnomalies: len(rep.StoreAnomalies), Restarts: r.Restarts, At: r.FaultAt().UTC().Format(time.RFC3339),
			OldLeaseVersion: r.OldVersion, NewLeaseVersion: r.NewVersion}
		if r.AcquireToFullS > 0 {
			// owner_broker_unreachable: the budget bounds the unreachable
			// winner's grant → the other instance's full service.
			rec.FailureToFullS = round3(r.AcquireToFullS)
		}
		if strings.Contains(s.Scenario, "+") {
			rec.SecondS, rec.BlipS = round3(s.Second.Seconds()), round3(s.Blip.Seconds())
		}
		problems := append([]string(nil), r.Problems...)
		for _, a := range rep.StoreAnomalies {
			problems = append(problems, "lease store: "+a)
		}
		rec.Verdict = Pass
		if !r.Pass || len(problems) > 0 {
			rec.Verdict = Fail
			rec.Cause = strings.Join(problems, "; ")
			if knownSQLiteFrozenWriter(rec, problems) {
				rec.Verdict = Limit
				rec.Cause = "known limit (docs/bridge.md, sqlite store: a frozen owner can block failover): " + rec.Cause
			}
		}
		recs = append(recs, rec)
	}
	if runErr != nil && len(recs) < len(specs) {
		// The round that could not finish is a failed round; the rest of
		// the batch did not run.
		s := specs[len(recs)]
		recs = append(recs, Record{Seed: s.Seed, Kind: KindBridge, Batch: b.Index, Round: roundOf(s.Seed), Store: s.Store, Broker: s.Broker,
			Rate: s.Rate, Scenario: s.Scenario, Faults: faultsOf(s.Scenario), DelayS: round3(s.Delay.Seconds()), Verdict: Fail,
			Cause: "lab: " + runErr.Error(), At: time.Now().UTC().Format(time.RFC3339)})
	}
	return recs, nil
}

// knownSQLiteFrozenWriter: an owner_sigstop round on sqlite whose
// successor could not take over while the owner was frozen.
func knownSQLiteFrozenWriter(r Record, problems []string) bool {
	if r.Store != lab.StoreSQLite || r.Scenario != lab.OwnerSIGSTOP || r.TwoOwners || r.Stale > 0 {
		return false
	}
	for _, p := range problems {
		if strings.Contains(p, "did not serve within") || p == "over budget" || strings.Contains(p, "resumed owner") || strings.HasSuffix(p, " lost") {
			continue
		}
		return false
	}
	return r.OverBudget
}

func setupFailed(b Batch, specs []Spec, cause string) []Record {
	s := specs[0]
	return []Record{{Seed: s.Seed, Kind: s.Kind, Batch: b.Index, Round: roundOf(s.Seed), Store: s.Store, Broker: s.Broker, Rate: s.Rate, Scenario: s.Scenario,
		Faults: faultsOf(s.Scenario), Verdict: Fail, Cause: "set-up: " + cause, At: time.Now().UTC().Format(time.RFC3339)}}
}

// runLeader runs a leader batch on one throwaway PostgreSQL.
func runLeader(ctx context.Context, work string, b Batch, specs []Spec, o Options) ([]Record, error) {
	logf, err := os.OpenFile(filepath.Join(work, "lab.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	replicas, err := os.OpenFile(filepath.Join(work, "replicas.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer replicas.Close()
	var mu sync.Mutex
	logln := func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(logf, time.Now().UTC().Format("15:04:05.000 ")+format+"\n", a...)
	}
	var jitter time.Duration
	l, err := leaderlab.New(ctx, leaderlab.Options{Exe: o.Exe, Log: logln, ReplicaLog: replicas,
		Jitter: func(maxd time.Duration) time.Duration {
			if maxd <= 0 {
				return 0
			}
			return jitter % maxd
		}})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return setupFailed(b, specs, "leader lab: "+err.Error()), nil
	}
	defer l.Close()
	var recs []Record
	for i, s := range specs {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		jitter = s.Delay
		logln("round %d seed %d: %s, follower jitter %v", i, s.Seed, s.Scenario, s.Delay)
		if s.Scenario == leaderlab.ScenarioNetworkDrop {
			netnsMu.Lock()
		}
		r, err := l.Run(ctx, s.Scenario)
		if s.Scenario == leaderlab.ScenarioNetworkDrop {
			netnsMu.Unlock()
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		rec := Record{Seed: s.Seed, Kind: KindLeader, Batch: b.Index, Round: roundOf(s.Seed), Store: StoreLeader, Scenario: s.Scenario,
			Faults: []string{s.Scenario}, DelayS: round3(s.Delay.Seconds()), FailureToFullS: r.MeasuredFailoverS, BudgetS: r.BoundS,
			Stale: r.StaleWritesCommitted, TwoOwners: r.OverlapDetected, StaleRejected: r.StaleWritesRejected,
			At: time.Now().UTC().Format(time.RFC3339), Verdict: Pass}
		if r.OldLeaderStoppedS != nil {
			rec.OldOwnerStopS = *r.OldLeaderStoppedS
		}
		var problems []string
		switch {
		case r.Skipped != "":
			rec.Verdict, rec.Cause = Skipped, r.Skipped
		case err != nil:
			problems = append(problems, err.Error())
		default:
			rec.OverBudget = !r.WithinBound()
			if rec.OverBudget {
				problems = append(problems, fmt.Sprintf("failover %.3fs over its bound %.3fs", r.MeasuredFailoverS, r.BoundS))
			}
			if r.OverlapDetected {
				problems = append(problems, "two leaders acting: a fenced write out of term order, or the old leader acting after the new one started")
			}
			if r.StaleWritesCommitted > 0 {
				problems = append(problems, fmt.Sprintf("%d writes of the old term committed after the new term began", r.StaleWritesCommitted))
			}
		}
		if len(problems) > 0 {
			rec.Verdict, rec.Cause = Fail, strings.Join(problems, "; ")
		}
		logln("round %d: %s %s", i, rec.Verdict, rec.Cause)
		recs = append(recs, rec)
	}
	return recs, nil
}

// Replay reruns the one round seed names, alone, in a fresh set-up, into
// the report directory dir (its rounds.jsonl gets the one line).
func Replay(ctx context.Context, seed int64, o Options) (Record, error) {
	spec, err := Decode(seed)
	if err != nil {
		return Record{}, err
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return Record{}, err
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return Record{}, err
	}
	b := Batch{Index: 0, Base: seed >> roundBits, First: int(seed & (1<<roundBits - 1)), N: 1}
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "proof: replaying seed %d: %s %s/%s rate %d, %s after %v\n", seed, spec.Kind, spec.Store, spec.Broker, spec.Rate, spec.Scenario, spec.Delay)
	}
	recs, err := runBatch(ctx, dir, b, o)
	if err != nil {
		return Record{}, err
	}
	if len(recs) == 0 {
		return Record{}, errors.New("the round did not run")
	}
	if err := (&writer{path: filepath.Join(dir, roundsFile)}).append(recs); err != nil {
		return recs[0], err
	}
	return recs[0], nil
}
