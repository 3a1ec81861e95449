package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/myriarch/myriarch/internal/bridge/lab"
)

// runOutageLab runs `myriarch-lab bridge` on outage scenarios with the
// real bridge binary and mosquitto (default queue limit) as the source.
func runOutageLab(t *testing.T, args ...string) (*lab.OutageReport, int, string) {
	t.Helper()
	_, err := lab.MosquittoPath()
	need(t, "mosquitto", err)
	bin, err := bridgeBinary()
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := commands.Dispatch(append([]string{"bridge", "--bridge", bin, "--json", "--keep", t.TempDir()}, args...), &out, &errb)
	var rep lab.OutageReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("exit %d, not JSON: %v\n%s\n%s", code, err, out.String(), errb.String())
	}
	return &rep, code, errb.String()
}

// TestDestinationOutage: the destination broker is down for 10s while
// mosquitto, with its default per-session queue (1000 messages), keeps
// receiving 200 msg/s for the bridge. Without a spool the bridge cannot
// acknowledge, mosquitto's queue overflows and drops messages silently;
// with a file spool the bridge acknowledges from the spool and nothing is
// lost, in per-topic order.
func TestDestinationOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("runs bridge processes through a 10s destination outage (~45s)")
	}
	rep, code, log := runOutageLab(t, "--scenarios", lab.DestinationOutage, "--rate", "200", "--outage", "10s", "--store", lab.StoreSQLite)
	if len(rep.Rows) != 2 {
		t.Fatalf("exit %d: %d rows, want the spool pass and the pass without\n%s", code, len(rep.Rows), log)
	}
	for _, r := range rep.Rows {
		if r.Published < 2000 || r.OutageS != 10 || len(r.PerTopic) != 4 {
			t.Errorf("%s: published %d in a %vs outage, %d topics: %+v", r.Spool, r.Published, r.OutageS, len(r.PerTopic), r)
		}
		switch r.Spool {
		case "file":
			// 10s at 200 msg/s: about 2,000 messages waited in the spool.
			if !r.Pass || r.Lost != 0 || r.OutOfOrder != 0 || r.Duplicates > r.DuplicateWindow || r.SpoolPeak < 1500 || r.Fsync != "interval" {
				t.Errorf("with the spool: %+v", r)
			}
		case "off":
			// mosquitto queued 1000 (plus what was in flight) and
			// dropped the rest.
			if r.Pass || r.Lost < 500 || r.SpoolPeak != 0 {
				t.Errorf("without the spool, want loss from mosquitto's queue limit: %+v", r)
			}
		default:
			t.Errorf("row with spool %q", r.Spool)
		}
	}
	if code != 0 || !rep.OK() {
		t.Errorf("exit %d, OK %t: the spool pass passed, so the run must\n%s", code, rep.OK(), log)
	}
}

// TestDestinationOutageOwnerKill: the same on a pair sharing a sqlite
// lease store and the spool directory; the owner is killed halfway
// through a 16s outage and the standby continues from the spool. 50
// msg/s keeps the failover itself (about 7s here, nothing reads the source
// session meanwhile) within mosquitto's default queue of 1000 even if a
// loaded host makes it take three times as long.
func TestDestinationOutageOwnerKill(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a bridge pair through a 16s destination outage with an owner kill (~50s)")
	}
	rep, code, log := runOutageLab(t, "--scenarios", lab.DestinationOutageOwnerKill, "--rate", "50", "--outage", "16s", "--spool", "on")
	if len(rep.Rows) != 1 {
		t.Fatalf("exit %d: %d rows, want the spool pass\n%s", code, len(rep.Rows), log)
	}
	r := rep.Rows[0]
	if !r.Pass || r.Lost != 0 || r.OutOfOrder != 0 || r.Duplicates > r.DuplicateWindow || r.Published < 800 ||
		r.FailoverS == nil || *r.FailoverS <= 0 || r.LostDuringFailover == nil || *r.LostDuringFailover != 0 || r.SpoolPeak < 400 {
		t.Errorf("exit %d: %+v\n%s", code, r, log)
	}
	if code != 0 {
		t.Errorf("exit %d\n%s", code, log)
	}
}

// TestOutageFlags: bad outage flags are refused naming the flag.
func TestOutageFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--scenarios", lab.DestinationOutage + "," + lab.OwnerSIGKILL},
		{"--scenarios", lab.DestinationOutage, "--outage", "0s"},
		{"--scenarios", lab.DestinationOutage, "--broker", "mosquitto:x"},
	} {
		var out, errb bytes.Buffer
		if code := commands.Dispatch(append([]string{"bridge", "--bridge", "/bin/true"}, args...), &out, &errb); code != 2 || errb.Len() == 0 {
			t.Errorf("%q: exit %d, stderr %q; want 2 and a message", args, code, errb.String())
		}
	}
}
