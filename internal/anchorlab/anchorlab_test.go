package anchorlab

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/pgtest"
)

func TestMain(m *testing.M) {
	MaybeRunCandidate()
	goleak.VerifyTestMain(m)
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", bytes.TrimRight(p, "\n"))
	return len(p), nil
}

// The short anchors lab: SIGSTOP past the TTL under every system (in
// parallel) and the netns drop under Myriarch's lease. It asserts what
// must hold whatever the machine's load: counts and order, no timings.
func TestAnchorsShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, etcd and candidate processes (~60s)")
	}
	ci := os.Getenv("CI") == "true"
	if _, err := pgtest.BinDir(); err != nil && !ci {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// Stop stays at its default (20s, past pgleader's 13.5s frozen-leader
	// bound with room for a loaded machine); the waits after it are short:
	// the assertions are on counts and order, which the waits do not change.
	opts := Options{Log: t.Logf, RequireNetns: ci, After: 2 * time.Second, Timeout: 15 * time.Second}
	if testing.Verbose() {
		opts.CandidateLog = logWriter{t}
	}
	l, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	}()

	type job struct{ system, fault string }
	// Each group runs in parallel with the others; the jobs of a group run
	// one after the other (one set of network namespaces at a time).
	groups := [][]job{
		{{SystemLease, FaultSigstop}}, {{SystemPGLeader, FaultSigstop}}, {{SystemEtcd, FaultSigstop}},
		{{SystemPGAdvisory, FaultSigstop}}, {{SystemLease, FaultNetnsDrop}, {SystemPGAdvisoryKA, FaultNetnsDrop}},
	}
	var mu sync.Mutex
	got := map[string]Row{}
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() {
			for _, j := range g {
				rows, err := l.Run(ctx, j.system, j.fault, 1)
				if err != nil {
					t.Errorf("%s under %s: %v", j.system, j.fault, err)
					continue
				}
				mu.Lock()
				for _, r := range rows {
					t.Logf("%+v new=%v last=%v", r, deref(r.NewLeaderS), deref(r.DeposedLastS))
					got[r.System+"/"+r.Fault] = r
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	// Myriarch: a new leader, and not one write of the deposed leader
	// taken after the new leader's first.
	for _, k := range []string{SystemLease + "/" + FaultSigstop, SystemPGLeader + "/" + FaultSigstop, SystemLease + "/" + FaultNetnsDrop} {
		r := got[k]
		if r.Skipped != "" {
			t.Logf("%s: skipped: %s", k, r.Skipped)
			continue
		}
		if r.NewLeaderS == nil {
			t.Errorf("%s: no new leader", k)
		}
		// Its own check stops the deposed leader; a write it had checked
		// just before the freeze can still land after SIGCONT (the pause
		// between check and act), and the token must reject it.
		if r.DeposedAccepted != 0 {
			t.Errorf("%s: the resource took %d writes of the deposed leader after the new leader's first", k, r.DeposedAccepted)
		}
	}
	// etcd: a new leader; the resource that checks the create revision
	// takes none of the deposed leader's writes, the one that does not
	// takes every one that reached it.
	plain, rev := got[SystemEtcd+"/"+FaultSigstop], got[RowEtcdRev+"/"+FaultSigstop]
	if plain.NewLeaderS == nil || rev.NewLeaderS == nil {
		t.Errorf("etcd: no new leader: %+v", plain)
	}
	if rev.DeposedAccepted != 0 || rev.DeposedRejected != rev.DeposedWrites {
		t.Errorf("etcd+rev: deposed writes %d, accepted %d, rejected %d; want all rejected", rev.DeposedWrites, rev.DeposedAccepted, rev.DeposedRejected)
	}
	if plain.DeposedAccepted != plain.DeposedWrites || plain.DeposedWrites != rev.DeposedWrites {
		t.Errorf("etcd without token: deposed writes %d, accepted %d; want all accepted", plain.DeposedWrites, plain.DeposedAccepted)
	}
	// The naive advisory lock: the frozen leader's session keeps the lock
	// (no keepalive, nothing on the server notices a stopped process), so
	// no other candidate leads, during the stop or after it.
	pg := got[SystemPGAdvisory+"/"+FaultSigstop]
	if pg.NewLeaderS != nil {
		t.Errorf("pg advisory lock: a new leader after %.3fs; the frozen session should have kept the lock", *pg.NewLeaderS)
	}
	// With the server's keepalives and user timeout on the lock session,
	// the server drops the cut-off leader's session and the follower
	// leads; the cut-off leader's query hangs (no client timeout), it
	// still believes it leads, and the resource takes its writes: two
	// acting owners, silently.
	ka := got[SystemPGAdvisoryKA+"/"+FaultNetnsDrop]
	if ka.Skipped == "" {
		if ka.NewLeaderS == nil {
			t.Errorf("pg advisory lock with keepalives: no new leader")
		}
		if ka.DeposedAccepted == 0 {
			t.Errorf("pg advisory lock with keepalives: the cut-off leader wrote nothing after the new leader's first write: %+v", ka)
		}
	}
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

// measure counts only the old leader's writes after the new leader's
// first, splits them by the resource's answer, and derives the etcd rows.
func TestMeasure(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	recs := []Record{
		{Kind: KindWrite, Writer: "a", Token: 5, At: at(-100), Accepted: true},
		{Kind: KindMsg, Writer: "a", At: at(-99), Accepted: true},
		{Kind: KindWrite, Writer: "b", Token: 9, At: at(3000), Accepted: true},
		{Kind: KindMsg, Writer: "b", At: at(3001), Accepted: true},
		{Kind: KindWrite, Writer: "a", Token: 5, At: at(3500), Accepted: false},
		{Kind: KindMsg, Writer: "a", At: at(3501), Accepted: true},
		{Kind: KindRefused, Writer: "a", Token: 5, At: at(3600), Accepted: true},
		{Kind: KindWrite, Writer: "a", Token: 5, At: at(4000), Accepted: false},
	}
	rows := measure(Row{System: SystemEtcd, Fault: FaultSigstop, Token: tokenName(SystemEtcd)}, recs, "a", "b", t0)
	if len(rows) != 2 {
		t.Fatalf("rows %d, want 2", len(rows))
	}
	plain, rev := rows[0], rows[1]
	if rev.System != RowEtcdRev || *rev.NewLeaderS != 3 || rev.DeposedWrites != 2 || rev.DeposedRejected != 2 ||
		rev.DeposedAccepted != 0 || rev.DeposedRefused != 1 || rev.DeposedMsgs != 1 || *rev.DeposedLastS != 1 {
		t.Errorf("with the token: %+v", rev)
	}
	if rev.OldLastS == nil || *rev.OldLastS != 4 {
		t.Errorf("old leader's last write after the fault: %v, want 4", deref(rev.OldLastS))
	}
	if plain.System != SystemEtcd || plain.DeposedAccepted != 2 || plain.DeposedRejected != 0 || !strings.Contains(plain.Token, "not checked") {
		t.Errorf("without the token: %+v", plain)
	}
	// No new leader: nothing is deposed.
	rows = measure(Row{System: SystemPGAdvisory}, recs[:2], "a", "b", t0)
	if len(rows) != 1 || rows[0].NewLeaderS != nil || rows[0].DeposedWrites != 0 {
		t.Errorf("no new leader: %+v", rows)
	}
}

// The sink rejects a write whose token is below the run's highest, takes
// writes without a token, and keeps runs apart.
func TestSinkFence(t *testing.T) {
	s := NewSink()
	defer s.Close()
	for _, w := range []struct {
		run  string
		tok  int64
		want bool
	}{{"r1", 5, true}, {"r1", 7, true}, {"r1", 5, false}, {"r1", 0, true}, {"r1", 7, true}, {"r2", 1, true}} {
		rec := httpPost(t, s, w.run, w.tok)
		if rec != w.want {
			t.Errorf("run %s token %d: accepted %v, want %v", w.run, w.tok, rec, w.want)
		}
	}
	if n := len(s.Records("r1")); n != 5 {
		t.Errorf("r1 records %d, want 5", n)
	}
}

func httpPost(t *testing.T, s *Sink, run string, tok int64) bool {
	t.Helper()
	w := httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest("POST", "/write?run="+run+"&writer=x&token="+strconv.FormatInt(tok, 10), nil))
	switch w.Code {
	case 204:
		return true
	case 409:
		return false
	}
	t.Fatalf("status %d", w.Code)
	return false
}
