package lab

import (
	"strconv"
	"strings"
	"testing"

	"github.com/eclipse/paho.golang/paho"
)

// TestOutageSinkJudge feeds the outage sink a delivery history with each
// thing it must count: a lost message, duplicates (which go back in a
// topic by design and are not out of order), and a first delivery that
// arrives after a later message of its topic.
func TestOutageSinkJudge(t *testing.T) {
	s := newOutageSink("n", 2)
	deliver := func(seqs ...int) {
		for _, q := range seqs {
			s.receive(&paho.Publish{Payload: []byte("n/" + strconv.Itoa(q))})
		}
	}
	// Topic 0 gets the even seqs, topic 1 the odd ones. 5 is lost, 2 and
	// 3 are delivered twice, 6 arrives after 8 (out of order on topic 0).
	deliver(0, 1, 2, 3, 2, 3, 4, 8, 6, 7, 9)
	deliver(7) // a third topic-1 duplicate, going back
	s.receive(&paho.Publish{Payload: []byte("other/1")})
	var row OutageRow
	s.judge(&row, 10)
	if row.Lost != 1 || row.LostIDs[0] != 5 || row.Duplicates != 3 || row.OutOfOrder != 1 || row.Delivered != 12 {
		t.Fatalf("%+v", row)
	}
	if pt := row.PerTopic; pt[0].OutOfOrder != 1 || pt[1].OutOfOrder != 0 || pt[1].Lost != 1 || pt[0].Duplicates != 1 || pt[1].Duplicates != 2 || pt[0].Published != 5 {
		t.Errorf("per topic: %+v", pt)
	}
	if n := s.lostIn(4, 12); n != 3 { // 5, and 10 and 11 never published
		t.Errorf("lostIn(4, 12) = %d, want 3", n)
	}
}

// TestDuplicateWindow: the window grows with the disruptions a scenario
// has, and the rule says what it is made of.
func TestDuplicateWindow(t *testing.T) {
	alone, _ := duplicateWindow(false, true, 500)
	pairOff, _ := duplicateWindow(true, false, 500)
	pairOn, rule := duplicateWindow(true, true, 500)
	if alone != outageMaxInFlight || pairOff != outageMaxInFlight+outageReceiveMaximum || pairOn != pairOff+100+outageMaxInFlight || !strings.Contains(rule, "fsync_interval") {
		t.Errorf("windows %d %d %d (%s)", alone, pairOff, pairOn, rule)
	}
}

// TestOutageRendering: the spool block follows the store (a file spool
// in the pass's directory on sqlite, the PostgreSQL outbox on postgres),
// and the configuration without a spool has none.
func TestOutageRendering(t *testing.T) {
	r := outageRendering{bridge: "outage-spool", instance: "a", dir: "/d", store: `{type: sqlite, path: "/d/lease.db"}`,
		source: "tcp://127.0.0.1:1", dest: "tcp://127.0.0.1:2", nonce: "n", spool: SpoolBlockFor(StoreSQLite, "always")}
	if s := r.String(); !strings.Contains(s, `spool: {dir: "/d/spool", fsync: always}`) {
		t.Errorf("sqlite:\n%s", s)
	}
	if b := SpoolBlockFor(StorePostgres, "interval"); b != "{backend: postgres}" {
		t.Errorf("postgres: %s", b)
	}
	r.spool = ""
	if s := r.String(); strings.Contains(s, "spool:") {
		t.Errorf("without a spool:\n%s", s)
	}
}
