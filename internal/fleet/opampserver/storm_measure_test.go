package opampserver

import (
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/myriarch/myriarch/internal/fleet/fleettest"
)

// TestMeasureDuplicateUIDStorm is a measurement, not a check: two real
// opamp-go clients with one instance UID and the enrollment secret, for
// MYRIARCH_MEASURE_SECONDS (default 10). It prints the accepted
// connections per second and the CPU of this process (server and both
// clients). Run it with MYRIARCH_MEASURE=1:
//
//	MYRIARCH_MEASURE=1 go test -run TestMeasureDuplicateUIDStorm -v ./internal/fleet/opampserver/
func TestMeasureDuplicateUIDStorm(t *testing.T) {
	if os.Getenv("MYRIARCH_MEASURE") == "" {
		t.Skip("a measurement; set MYRIARCH_MEASURE=1")
	}
	window := 10 * time.Second
	if d, err := time.ParseDuration(os.Getenv("MYRIARCH_MEASURE_SECONDS") + "s"); err == nil && d > 0 {
		window = d
	}
	st := openStore(t)
	r := newRig(t, st, "r1", "n1")
	defer r.stop(t)
	a := startAgent(t, fleettest.AgentOptions{URL: r.ws})
	if !fleettest.Eventually(30*time.Second, func() bool { return r.srv.Connections() == 1 }) {
		t.Fatal("first agent never connected")
	}
	b := startAgent(t, fleettest.AgentOptions{URL: r.ws, UID: a.UID})
	time.Sleep(time.Second)
	c0, cpu0 := testutil.ToFloat64(r.srv.mConnects), cpuTime(t)
	time.Sleep(window)
	c1, cpu1 := testutil.ToFloat64(r.srv.mConnects), cpuTime(t)
	t.Logf("MEASURE duplicate UID, two opamp-go clients, %v: %.1f accepted connections/s, CPU %.1f%% of a core (server + clients); agent connects %d and %d",
		window, (c1-c0)/window.Seconds(), 100*float64(cpu1-cpu0)/float64(window), a.Connects(), b.Connects())
}
