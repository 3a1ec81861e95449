package anchorlab

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
)

// Cell aggregates the runs of one system (row name) under one fault.
type Cell struct {
	System, Fault, Token string
	Runs                 int
	// NewLeader: the times to a new leader of the runs that had one.
	NewLeader []float64
	// NoNewLeader counts runs without a new leader.
	NoNewLeader                                   int
	DeposedAccepted, DeposedRejected              int
	DeposedRefused, DeposedMsgs, MaxAcceptedInRun int
	// DeposedLastMax is the latest deposed write after the new leader's
	// first, over the runs; negative when there was none.
	DeposedLastMax float64
	// OldLast: per run, the old leader's last write after the fault
	// (runs without one count as 0).
	OldLast []float64
	Skipped string
}

// Cells groups rows by system and fault, in the order of first appearance.
func Cells(rows []Row) []*Cell {
	var out []*Cell
	idx := map[[2]string]*Cell{}
	for _, r := range rows {
		k := [2]string{r.System, r.Fault}
		c := idx[k]
		if c == nil {
			c = &Cell{System: r.System, Fault: r.Fault, Token: r.Token, DeposedLastMax: -1}
			idx[k] = c
			out = append(out, c)
		}
		if r.Skipped != "" {
			c.Skipped = r.Skipped
			continue
		}
		c.Runs++
		if r.NewLeaderS == nil {
			c.NoNewLeader++
		} else {
			c.NewLeader = append(c.NewLeader, *r.NewLeaderS)
		}
		c.DeposedAccepted += r.DeposedAccepted
		c.DeposedRejected += r.DeposedRejected
		c.DeposedRefused += r.DeposedRefused
		c.DeposedMsgs += r.DeposedMsgs
		c.MaxAcceptedInRun = max(c.MaxAcceptedInRun, r.DeposedAccepted)
		old := 0.0
		if r.OldLastS != nil {
			old = *r.OldLastS
		}
		c.OldLast = append(c.OldLast, old)
		if r.DeposedLastS != nil {
			c.DeposedLastMax = max(c.DeposedLastMax, *r.DeposedLastS)
		}
	}
	return out
}

// MinMedMax formats min/median/max of v ("–" when empty).
func MinMedMax(v []float64) string {
	if len(v) == 0 {
		return "–"
	}
	s := slices.Clone(v)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return fmt.Sprintf("%.1f / %.1f / %.1f", s[0], med, s[len(s)-1])
}

// WriteTable prints the cells as a Markdown table.
func WriteTable(w io.Writer, cells []*Cell) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "| system\t fault\t runs\t new leader s (min / med / max)\t runs without new leader\t deposed writes accepted (max in a run)\t rejected by token\t stopped by own check\t deposed stream msgs\t last deposed write s\t old leader's last write after the fault s (min / med / max)\t token checked\t")
	fmt.Fprintln(tw, "|---\t---\t---\t---\t---\t---\t---\t---\t---\t---\t---\t---\t")
	for _, c := range cells {
		if c.Skipped != "" {
			fmt.Fprintf(tw, "| %s\t %s\t 0\t not run: %s\t\t\t\t\t\t\t\t\t\n", c.System, c.Fault, short(c.Skipped))
			continue
		}
		last := "–"
		if c.DeposedLastMax >= 0 {
			last = fmt.Sprintf("%.2f", c.DeposedLastMax)
		}
		fmt.Fprintf(tw, "| %s\t %s\t %d\t %s\t %d\t %d (%d)\t %d\t %d\t %d\t %s\t %s\t %s\t\n", c.System, c.Fault, c.Runs,
			MinMedMax(c.NewLeader), c.NoNewLeader, c.DeposedAccepted, c.MaxAcceptedInRun, c.DeposedRejected,
			c.DeposedRefused, c.DeposedMsgs, last, MinMedMax(c.OldLast), c.Token)
	}
	_ = tw.Flush()
}

func short(s string) string {
	if i := strings.Index(s, ":"); i > 0 && i < 80 {
		return s[:i]
	}
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// Summary is the last line of `myriarch-lab anchors` (one JSON object).
type Summary struct {
	// Rows counts the JSON rows printed (skipped ones included).
	Rows    int      `json:"rows"`
	Reps    int      `json:"reps"`
	Systems []string `json:"systems"`
	Faults  []string `json:"faults"`
	// DeposedWritesAccepted, per row system: writes of a deposed leader
	// that the resource took after the new leader's first write, over all
	// faults and runs. DeposedWritesRejected: those it refused by token.
	DeposedWritesAccepted map[string]int `json:"deposed_writes_accepted"`
	DeposedWritesRejected map[string]int `json:"deposed_writes_rejected"`
	// NoNewLeader, per row system: runs in which no new leader wrote.
	NoNewLeader map[string]int `json:"no_new_leader"`
	// Skipped, per row system and fault ("system/fault"): why it did not run.
	Skipped map[string]string `json:"skipped"`
	// Load is /proc/loadavg at the start and at the end.
	Load  string `json:"load"`
	Error string `json:"error,omitempty"`
}

// Summarize builds the summary of rows.
func Summarize(rows []Row, reps int, faults []string, load string) Summary {
	s := Summary{Rows: len(rows), Reps: reps, Faults: faults, Load: load,
		DeposedWritesAccepted: map[string]int{}, DeposedWritesRejected: map[string]int{},
		NoNewLeader: map[string]int{}, Skipped: map[string]string{}}
	for _, r := range rows {
		if !slices.Contains(s.Systems, r.System) {
			s.Systems = append(s.Systems, r.System)
		}
		if r.Skipped != "" {
			s.Skipped[r.System+"/"+r.Fault] = r.Skipped
			continue
		}
		s.DeposedWritesAccepted[r.System] += r.DeposedAccepted
		s.DeposedWritesRejected[r.System] += r.DeposedRejected
		if r.NewLeaderS == nil {
			s.NoNewLeader[r.System]++
		} else {
			s.NoNewLeader[r.System] += 0
		}
	}
	return s
}

// LoadAvg returns the first three fields of /proc/loadavg.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
