package proof

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Options configure a campaign.
type Options struct {
	// Dir is the report directory. A campaign.json there is the campaign
	// a rerun continues: its seed, size and stores win over these.
	Dir    string
	Seed   int64
	Size   Size
	Stores []string
	// NoLeader leaves out the leader rounds.
	NoLeader bool
	// Parallel overrides Size.Parallel when positive (it may change
	// between a run and its continuation).
	Parallel int
	// BridgeCommand starts a myriarch-bridge process.
	BridgeCommand func(args ...string) *exec.Cmd
	// Exe is the binary the leader lab re-executes as a replica (it must
	// call leaderlab.MaybeRunReplica first); "" is this one.
	Exe string
	// Progress gets one line per finished batch and round; nil discards.
	Progress io.Writer
	// Budget, when positive, stops starting batches once it has passed
	// (the ones running finish); a rerun continues.
	Budget time.Duration
}

// Campaign is campaign.json: what a rerun continues.
type Campaign struct {
	Seed     int64     `json:"seed"`
	Size     Size      `json:"size"`
	Stores   []string  `json:"stores"`
	Leader   bool      `json:"leader"`
	Started  time.Time `json:"started"`
	Batches  int       `json:"batches"`
	Rounds   int       `json:"rounds"`
	Revision string    `json:"revision,omitempty"`
}

// Record is one round: one line of rounds.jsonl.
type Record struct {
	Seed     int64    `json:"seed"`
	Kind     string   `json:"kind"`
	Batch    int      `json:"batch"`
	Round    int      `json:"round"`
	Store    string   `json:"store"`
	Broker   string   `json:"broker,omitempty"`
	Rate     int      `json:"rate,omitempty"`
	Scenario string   `json:"scenario"`
	Faults   []string `json:"faults"`
	// DelayS: stable pair → fault; SecondS and BlipS: when the second
	// fault of an overlapping scenario starts after the first and how
	// long it lasts.
	DelayS         float64 `json:"delay_s"`
	SecondS        float64 `json:"second_s,omitempty"`
	BlipS          float64 `json:"blip_s,omitempty"`
	FailureToFullS float64 `json:"failure_to_full_s"`
	FirstDeliveryS float64 `json:"first_delivery_s,omitempty"`
	BudgetS        float64 `json:"budget_s"`
	OverBudget     bool    `json:"over_budget"`
	Published      int     `json:"published"`
	PredictedLoss  int     `json:"predicted_loss"`
	Lost           int     `json:"lost"`
	// LostIDs are up to 20 of the lost sequence numbers.
	LostIDs        []int   `json:"lost_ids,omitempty"`
	Duplicates     int     `json:"duplicates"`
	DuplicateBound int     `json:"duplicate_bound"`
	Stale          int     `json:"stale"`
	TwoOwners      bool    `json:"two_owners"`
	StoreAnomalies int     `json:"store_anomalies,omitempty"`
	OldOwnerStopS  float64 `json:"old_owner_stopped_s,omitempty"`
	StaleRejected  int     `json:"stale_writes_rejected,omitempty"`
	Restarts       int     `json:"restarts,omitempty"`
	Verdict        string  `json:"verdict"`
	Cause          string  `json:"cause,omitempty"`
	LogDir         string  `json:"log_dir,omitempty"`
	At             string  `json:"at"`
	BatchDurationS float64 `json:"batch_duration_s"`
	// Load1 is the host's 1-minute load average when the batch ended:
	// a starved host (load far above its cores) misses deadlines that a
	// quiet one meets.
	Load1           float64 `json:"load1"`
	OldLeaseVersion int64   `json:"old_version,omitempty"`
	NewLeaseVersion int64   `json:"new_version,omitempty"`
}

// Verdicts.
const (
	Pass = "pass"
	Fail = "fail"
	// Limit: a documented limitation, with its measured frequency (the
	// sqlite store's frozen writer).
	Limit = "limit"
	// Skipped: the round could not run here (network namespaces need
	// root); not counted as a round.
	Skipped = "skipped"
)

// Final is the campaign's one-line result.
type Final struct {
	Rounds          int      `json:"rounds"`
	Failed          int      `json:"failed"`
	TwoOwnerRounds  int      `json:"two_owner_rounds"`
	StaleDeliveries int      `json:"stale_deliveries"`
	Lost            int      `json:"lost"`
	OverBudget      int      `json:"over_budget"`
	Stores          []string `json:"stores"`
	Report          string   `json:"report"`
	KnownLimit      int      `json:"known_limit_rounds"`
	KnownLimitLost  int      `json:"known_limit_lost"`
	Skipped         int      `json:"skipped"`
	Planned         int      `json:"planned"`
}

// OK reports a campaign without a failed round, a two-owner round, a stale
// delivery, a loss outside known limits, or a round over budget.
func (f Final) OK() bool {
	return f.Failed == 0 && f.TwoOwnerRounds == 0 && f.StaleDeliveries == 0 && f.Lost == 0 && f.OverBudget == 0
}

const (
	campaignFile = "campaign.json"
	roundsFile   = "rounds.jsonl"
)

// Run runs (or continues) a campaign and writes its report.
func Run(ctx context.Context, o Options) (Final, error) {
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return Final{}, err
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return Final{}, err
	}
	c, err := loadOrCreate(dir, o)
	if err != nil {
		return Final{}, err
	}
	batches, err := Plan(c.Seed, c.Size, c.Stores, c.Leader)
	if err != nil {
		return Final{}, err
	}
	recs, err := ReadRounds(dir)
	if err != nil {
		return Final{}, err
	}
	done := map[int]bool{}
	for _, r := range recs {
		done[r.Batch] = true
	}
	var todo []Batch
	for _, b := range batches {
		if !done[b.Index] {
			todo = append(todo, b)
		}
	}
	if len(done) > 0 {
		fmt.Fprintf(o.Progress, "proof: continuing %s: %d of %d batches done (%d rounds), %d to run\n", dir, len(done), len(batches), len(recs), len(todo))
	} else {
		fmt.Fprintf(o.Progress, "proof: campaign seed %d, size %s: %d batches, %d rounds, into %s\n", c.Seed, c.Size.Name, len(batches), c.Rounds, dir)
	}
	par := c.Size.Parallel
	if o.Parallel > 0 {
		par = o.Parallel
	}
	par = max(1, par)
	w := &writer{path: filepath.Join(dir, roundsFile)}
	start := time.Now()
	work := make(chan Batch)
	var wg sync.WaitGroup
	errs := make(chan error, par)
	for range par {
		wg.Go(func() {
			for b := range work {
				rs, err := runBatch(ctx, dir, b, o)
				if ctx.Err() != nil {
					return // abandoned: a rerun runs it again
				}
				if err != nil {
					errs <- err
					return
				}
				if err := w.append(rs); err != nil {
					errs <- err
					return
				}
				for _, r := range rs {
					fmt.Fprintf(o.Progress, "proof: batch %d round %d seed %d %s/%s %s: %s %.3fs (budget %.3fs) lost %d dup %d stale %d%s\n",
						r.Batch, r.Round, r.Seed, r.Store, r.Broker, r.Scenario, r.Verdict, r.FailureToFullS, r.BudgetS, r.Lost, r.Duplicates, r.Stale, causeSuffix(r))
				}
			}
		})
	}
	var runErr error
feed:
	for _, b := range todo {
		if o.Budget > 0 && time.Since(start) > o.Budget {
			fmt.Fprintf(o.Progress, "proof: time budget %v used; rerun with the same directory to continue\n", o.Budget)
			break
		}
		select {
		case work <- b:
		case <-ctx.Done():
			break feed
		case runErr = <-errs:
			break feed
		}
	}
	close(work)
	wg.Wait()
	if runErr == nil {
		select {
		case runErr = <-errs:
		default:
		}
	}
	_ = os.Remove(filepath.Join(dir, "work")) // when empty
	recs, err = ReadRounds(dir)
	if err != nil {
		return Final{}, err
	}
	fin := Summarize(recs, dir)
	fin.Planned = c.Rounds
	if err := WriteReport(dir, c, recs, fin); err != nil {
		return fin, err
	}
	if runErr == nil {
		runErr = ctx.Err()
	}
	return fin, runErr
}

func causeSuffix(r Record) string {
	if r.Cause == "" {
		return ""
	}
	return " — " + r.Cause
}

func loadOrCreate(dir string, o Options) (Campaign, error) {
	path := filepath.Join(dir, campaignFile)
	b, err := os.ReadFile(path)
	if err == nil {
		var c Campaign
		if err := json.Unmarshal(b, &c); err != nil {
			return c, fmt.Errorf("%s: %w", path, err)
		}
		return c, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return Campaign{}, err
	}
	if len(o.Stores) == 0 {
		return Campaign{}, errors.New("stores: at least one of sqlite, postgres, etcd")
	}
	c := Campaign{Seed: o.Seed, Size: o.Size, Stores: o.Stores, Leader: !o.NoLeader, Started: time.Now().UTC()}
	bs, err := Plan(c.Seed, c.Size, c.Stores, c.Leader)
	if err != nil {
		return c, err
	}
	c.Batches = len(bs)
	for _, b := range bs {
		c.Rounds += b.N
	}
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		c.Revision = strings.TrimSpace(string(out))
	}
	b, _ = json.MarshalIndent(c, "", "  ")
	return c, os.WriteFile(path, append(b, '\n'), 0o644)
}

// writer appends a batch's lines in one write, so that a stopped campaign
// leaves whole batches (a torn last line is dropped on reading).
type writer struct {
	mu   sync.Mutex
	path string
}

func (w *writer) append(rs []Record) error {
	var buf bytes.Buffer
	for _, r := range rs {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		buf.Write(b)
		buf.WriteByte('\n')
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	f, err := os.OpenFile(w.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(buf.Bytes()); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ReadRounds reads rounds.jsonl; a torn last line (a campaign stopped
// mid-write) is cut off, with the rest of its batch.
func ReadRounds(dir string) ([]Record, error) {
	path := filepath.Join(dir, roundsFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Record
	good := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	off := 0
	for sc.Scan() {
		line := sc.Bytes()
		next := off + len(line) + 1
		if next > len(b) { // no newline: torn
			break
		}
		var r Record
		if err := json.Unmarshal(line, &r); err != nil {
			break
		}
		out = append(out, r)
		off = next
		good = off
	}
	if good < len(b) {
		// Drop the torn batch entirely: its first lines made it, its last did not.
		if len(out) > 0 {
			last := out[len(out)-1].Batch
			for len(out) > 0 && out[len(out)-1].Batch == last {
				out = out[:len(out)-1]
			}
		}
		var keep bytes.Buffer
		for _, r := range out {
			line, _ := json.Marshal(r)
			keep.Write(line)
			keep.WriteByte('\n')
		}
		if err := os.WriteFile(path, keep.Bytes(), 0o644); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Summarize folds the records into the final line.
func Summarize(recs []Record, dir string) Final {
	f := Final{Report: dir, Stores: []string{}}
	for _, r := range recs {
		if r.Verdict == Skipped {
			f.Skipped++
			continue
		}
		f.Rounds++
		if !slices.Contains(f.Stores, r.Store) {
			f.Stores = append(f.Stores, r.Store)
		}
		switch r.Verdict {
		case Fail:
			f.Failed++
		case Limit:
			f.KnownLimit++
		}
		if r.TwoOwners {
			f.TwoOwnerRounds++
		}
		f.StaleDeliveries += r.Stale
		if r.Verdict == Limit {
			f.KnownLimitLost += r.Lost
		} else {
			f.Lost += r.Lost
		}
		if r.OverBudget && r.Verdict != Limit {
			f.OverBudget++
		}
	}
	order := map[string]int{"sqlite": 0, "postgres": 1, "etcd": 2, StoreLeader: 3}
	sort.Slice(f.Stores, func(i, j int) bool { return order[f.Stores[i]] < order[f.Stores[j]] })
	return f
}
