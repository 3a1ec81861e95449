package lab

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestJudge feeds the judge a run whose deliveries contain each failure it
// must catch: a lost message, duplicates over the window, a stale owner's
// delivery after the successor's first, and a late last delivery.
func TestJudge(t *testing.T) {
	t0 := time.Now()
	e := &env{sink: newSink("n"), hist: &history{}, published: 20}
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	add := func(s float64, seq int, v int64) {
		e.sink.all = append(e.sink.all, delivery{At: at(s), Seq: seq, Version: v})
		e.sink.seen[seq]++
	}
	// Round 0 (seq 0-9, fault at 1s): the owner (v1) delivers 0-4, the
	// successor (v2) 4-9 (one duplicate), then v1 delivers 5 again at 8s.
	for q := range 5 {
		add(0.5, q, 1)
	}
	for q := 4; q < 10; q++ {
		add(7, q, 2)
	}
	add(8, 5, 1)
	// Round 1 (seq 10-19, fault at 21s): 12 is lost, 13 arrives four times.
	for q := 10; q < 20; q++ {
		if q == 12 {
			continue
		}
		add(22, q, 3)
	}
	add(23, 13, 3)
	add(23, 13, 3)
	add(23, 13, 3)
	e.hist.changes = []change{{At: at(0), Owner: "a#1", Version: 1}, {At: at(6), Owner: "b#1", Version: 2}, {At: at(27), Owner: "a#2", Version: 3}}
	rep := &Report{Scenarios: []Result{
		{Round: 0, Scenario: OwnerSIGSTOP, start: at(0), fault: at(1), seqStart: 0, OldVersion: 1, DuplicateBound: 2, ttl: 6 * time.Second, WithinBudget: true},
		{Round: 1, Scenario: OwnerSIGKILL, start: at(20), fault: at(21), seqStart: 10, OldVersion: 2, DuplicateBound: 2, ttl: 6 * time.Second, WithinBudget: true},
	}}
	e.judge(rep)
	r0, r1 := rep.Scenarios[0], rep.Scenarios[1]
	if r0.Lost != 0 || r0.Duplicates != 2 || r0.StaleDeliveries != 1 || !r0.TwoOwners || r0.Pass {
		t.Errorf("round 0: %+v", r0)
	}
	if r0.OldOwnerLastDeliveryS == nil || *r0.OldOwnerLastDeliveryS != 7 {
		t.Errorf("round 0: old owner's last delivery %v, want 7s after the fault", r0.OldOwnerLastDeliveryS)
	}
	if r1.Lost != 1 || r1.LostIDs[0] != 12 || r1.Duplicates != 3 || r1.StaleDeliveries != 0 || r1.TwoOwners || r1.Pass {
		t.Errorf("round 1: %+v", r1)
	}
	if s := rep.Summary; s.Rounds != 2 || s.Passed != 0 || s.Lost != 1 || s.StaleDeliveries != 1 || !s.TwoOwners || s.MaxDuplicates != 3 {
		t.Errorf("summary: %+v", s)
	}
	if rep.OK() {
		t.Error("a run with failed rounds is OK")
	}
}

func TestAnomalies(t *testing.T) {
	ok := []change{{Owner: "a#1", Version: 1}, {Owner: "", Version: 1}, {Owner: "b#1", Version: 2}}
	if a := anomalies(ok); len(a) != 0 {
		t.Errorf("clean history: %q", a)
	}
	bad := []change{{Owner: "a#1", Version: 2}, {Owner: "b#1", Version: 2}, {Owner: "a#1", Version: 1}}
	if a := anomalies(bad); len(a) != 2 {
		t.Errorf("two holders of one version and a version going back: %q", a)
	}
}

// TestJudgeHandover: an owner_planned_stop round is split into the
// handover (old owner's last delivery → the successor's grant, from the
// lease row's renew record) and the activation; a handover over
// PlannedStopHandover fails the round, one within it passes.
func TestJudgeHandover(t *testing.T) {
	t0 := time.Now()
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	for _, tc := range []struct {
		name               string
		grant, seen, first float64
		handover, gap, act float64
		pass               bool
	}{
		// Granted 0.1s after the old owner's last delivery (at 1.0s), seen
		// by the poller 20ms later; the successor delivers 0.3s after.
		{"fast", 1.1, 1.12, 1.4, 0.1, 0.4, 0.3, true},
		// A standby that waited out its poll.
		{"poll", 3.0, 3.01, 3.2, 2.0, 2.2, 0.2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &env{sink: newSink("n"), hist: &history{}, published: 4}
			add := func(s float64, seq int, v int64) {
				e.sink.all = append(e.sink.all, delivery{At: at(s), Seq: seq, Version: v})
				e.sink.seen[seq]++
			}
			add(0.5, 0, 1)
			add(1.0, 1, 1)
			add(tc.first, 2, 2)
			add(tc.first+0.01, 3, 2)
			e.hist.changes = []change{{At: at(0), Owner: "a#1", Version: 1, RenewedAt: at(0)},
				{At: at(tc.seen), Owner: "b#1", Version: 2, RenewedAt: at(tc.grant)}}
			rep := &Report{Scenarios: []Result{{Scenario: OwnerPlannedStop, start: at(0), fault: at(0.99), OldVersion: 1, DuplicateBound: 2, ttl: 6 * time.Second, WithinBudget: true}}}
			e.judge(rep)
			r := rep.Scenarios[0]
			near := func(p *float64, want float64) bool { return p != nil && *p > want-1e-6 && *p < want+1e-6 }
			if !near(r.HandoverS, tc.handover) || !near(r.HandoverGapS, tc.gap) || !near(r.ActivationS, tc.act) || r.Pass != tc.pass {
				t.Errorf("handover %v gap %v activation %v pass %t problems %q; want %v %v %v %t",
					r.HandoverS, r.HandoverGapS, r.ActivationS, r.Pass, r.Problems, tc.handover, tc.gap, tc.act, tc.pass)
			}
			if a := rep.Summary.PerScenario[OwnerPlannedStop]; a.HandoverMaxS != *r.HandoverS {
				t.Errorf("summary handover max %v, want %v", a.HandoverMaxS, *r.HandoverS)
			}
		})
	}
}

// The lab reads each process's HTTP address from its log, in both of the
// bridge's log formats, and only from the line that reports it.
func TestListenAddrFromLog(t *testing.T) {
	for name, tc := range map[string]struct{ log, want string }{
		"text": {"time=x level=INFO msg=\"lease acquired\" addr=10.0.0.1:1\n" +
			"time=x level=INFO msg=\"serving /live /ready /status /metrics\" addr=127.0.0.1:41234\n", "127.0.0.1:41234"},
		"json":    {`{"time":"x","level":"INFO","msg":"serving /live /ready /status /metrics","addr":"127.0.0.1:5"}` + "\n", "127.0.0.1:5"},
		"not yet": {"time=x level=INFO msg=starting\n", ""},
		"cut off": {"time=x level=INFO msg=\"serving /live /ready /status /metrics\" addr=127.0.0.1:41", ""},
	} {
		if got := listenAddrFromLog(tc.log); got != tc.want {
			t.Errorf("%s: %q, want %q", name, got, tc.want)
		}
	}
}

// The faulted owner's local deadline binds it once another instance was
// granted a newer version; an owner nobody replaced (a frozen sqlite
// writer holding the lock) renews when it resumes and may deliver on.
func TestDeadlineBindsAReplacedOwnerOnly(t *testing.T) {
	for _, tc := range []struct {
		newVersion int64
		flagged    bool
	}{{newVersion: 2, flagged: true}, {newVersion: 1, flagged: false}} {
		t0 := time.Now()
		e := &env{sink: newSink("n"), hist: &history{}, published: 2}
		for q := range 2 {
			e.sink.all = append(e.sink.all, delivery{At: t0.Add(20 * time.Second), Seq: q, Version: 1})
			e.sink.seen[q]++
		}
		e.hist.changes = []change{{At: t0, Owner: "a#1", Version: 1}}
		rep := &Report{Scenarios: []Result{{Round: 0, Scenario: OwnerSIGSTOP, start: t0, fault: t0.Add(time.Second), OldVersion: 1,
			NewVersion: tc.newVersion, DuplicateBound: 2, ttl: 6 * time.Second, WithinBudget: true}}}
		e.judge(rep)
		r := rep.Scenarios[0]
		got := strings.Contains(strings.Join(r.Problems, "; "), "past its local deadline")
		if got != tc.flagged {
			t.Errorf("new version %d: flagged %v, want %v (problems %q)", tc.newVersion, got, tc.flagged, r.Problems)
		}
	}
}
