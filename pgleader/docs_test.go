package pgleader

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/failover"
)

var update = flag.Bool("update", false, "rewrite the generated tables in docs/leader-election.md")

const (
	docsPath  = "../docs/leader-election.md"
	docsBegin = "<!-- BEGIN generated: go test ./pgleader -run TestDocsNumbers -update -->"
	docsEnd   = "<!-- END generated -->"
)

func fmtSec(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + " s"
}

func fmtSecRound(d time.Duration) string {
	s := strconv.FormatFloat(d.Seconds(), 'f', 2, 64)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s + " s"
}

// docsTable renders the derived numbers for a few values of T.
func docsTable() string {
	ts := []time.Duration{10 * time.Second, 30 * time.Second, 60 * time.Second, 2 * time.Minute}
	ks := make([]failover.LeaderKeepalive, len(ts))
	for i, t := range ts {
		k, err := failover.DeriveLeaderKeepalive(t)
		if err != nil {
			panic(err)
		}
		ks[i] = k
	}
	var b strings.Builder
	b.WriteString("| ha.leaderSessionTimeout (T) |")
	for _, t := range ts {
		s := fmtSec(t)
		if t == failover.DefaultLeaderSessionTimeout {
			s += " (default)"
		}
		fmt.Fprintf(&b, " %s |", s)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(ts)) + "\n")
	row := func(name string, f func(k failover.LeaderKeepalive) string) {
		fmt.Fprintf(&b, "| %s |", name)
		for _, k := range ks {
			fmt.Fprintf(&b, " %s |", f(k))
		}
		b.WriteString("\n")
	}
	row("Follower retry, min(5 s, T/6), plus up to 20 % jitter", func(k failover.LeaderKeepalive) string {
		return fmtSecRound(k.FollowerRetry) + " – " + fmtSecRound(k.FollowerRetryMax)
	})
	row("Detection D", func(k failover.LeaderKeepalive) string { return fmtSec(k.Detection) })
	row("tcp_keepalives_idle = tcp_keepalives_interval = I", func(k failover.LeaderKeepalive) string { return fmtSec(k.KeepalivesIdle) })
	row("tcp_keepalives_count", func(k failover.LeaderKeepalive) string { return strconv.Itoa(k.KeepalivesCount) })
	row("tcp_user_timeout (ms)", func(k failover.LeaderKeepalive) string { return strconv.FormatInt(k.UserTimeout.Milliseconds(), 10) })
	row("Server drops a silent session after its last packet", func(k failover.LeaderKeepalive) string {
		return fmtSec(k.EarliestDrop) + " – " + fmtSec(k.LatestDrop)
	})
	row("Leader confirms its lock session every (timeout)", func(k failover.LeaderKeepalive) string {
		return fmtSecRound(k.ConfirmInterval) + " (" + fmtSecRound(k.ConfirmTimeout) + ")"
	})
	row("Leader resigns at the latest after the last answer (T/2)", func(k failover.LeaderKeepalive) string { return fmtSecRound(k.ResignAfter) })
	row("**Bound: hard failure of node or network**", func(k failover.LeaderKeepalive) string { return fmtSecRound(HardFailureBound(k)) })
	row("**Bound: frozen leader process** (T + longest retry + T/20 + 1 s)", func(k failover.LeaderKeepalive) string { return fmtSecRound(FrozenLeaderBound(k)) })
	row("**Bound: kill -9, crash** (longest retry + T/20)", func(k failover.LeaderKeepalive) string { return fmtSecRound(CleanCloseBound(k)) })
	row("**Bound: planned stop** (4 s release + longest retry + T/20)", func(k failover.LeaderKeepalive) string { return fmtSecRound(PlannedStopBound(k)) })
	return b.String()
}

// TestDocsNumbers keeps the numbers in docs/leader-election.md equal to
// what the code derives.
func TestDocsNumbers(t *testing.T) {
	raw, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	i, j := strings.Index(doc, docsBegin), strings.Index(doc, docsEnd)
	if i < 0 || j < i {
		t.Fatalf("%s: markers %q … %q not found", docsPath, docsBegin, docsEnd)
	}
	want := docsBegin + "\n" + docsTable() + docsEnd
	got := doc[i : j+len(docsEnd)]
	if got == want {
		return
	}
	if *update {
		if err := os.WriteFile(docsPath, []byte(doc[:i]+want+doc[j+len(docsEnd):]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s: the generated table is out of date; run go test ./pgleader -run TestDocsNumbers -update\n got:\n%s\nwant:\n%s", docsPath, got, want)
}
