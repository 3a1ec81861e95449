package lease_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/myriarch/myriarch/lease"
)

// A manager that replaces one its process just stepped down from (a
// reload that re-creates an owned session) and yields for one
// max_jittered_poll lets the standby, which the release woke, take the
// lease instead of winning it back at once: the planned-stop hand-over.
func TestYieldHandsTheLeaseToTheStandby(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "l.db")
	c := cadence()
	a := start(t, lease.Config{Store: openStore(t, path), Session: "s", InstanceID: "a", Cadence: c})
	acq := waitEvent(t, a, lease.EventAcquired, 10*time.Second)
	b := start(t, lease.Config{Store: openStore(t, path), Session: "s", InstanceID: "b", Cadence: c})
	time.Sleep(2 * c.AcquirePollInterval) // b stands by
	a.cancel()
	if err := a.wait(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// The replacement of a, started at once, with the yield.
	a2 := start(t, lease.Config{Store: openStore(t, path), Session: "s", InstanceID: "a", Cadence: c, Yield: c.MaxJitteredPoll()})
	bacq := waitEvent(t, b, lease.EventAcquired, 2*c.MaxJitteredPoll()+2*time.Second)
	if bacq.Token.Version != acq.Token.Version+1 {
		t.Fatalf("standby acquired version %d after %d", bacq.Token.Version, acq.Token.Version)
	}
	time.Sleep(c.MaxJitteredPoll() + c.AcquirePollInterval)
	if owns(a2) || !owns(b) {
		t.Fatalf("after the yield: the replacement owns %v, the standby owns %v; want the standby", owns(a2), owns(b))
	}
}
