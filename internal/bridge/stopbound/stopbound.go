// Package stopbound sizes how long a supervisor must let myriarch-bridge
// stop before it kills the process: Kubernetes' terminationGracePeriodSeconds
// and systemd's TimeoutStopSec. The chart and the unit in deploy/ carry the
// number this package computes, and a test there keeps them equal.
//
// A planned stop (SIGTERM) runs, in order:
//
//  1. Drain, at most bridge.shutdown_timeout: intake stops, in-flight
//     messages drain, each exclusive session steps down (close the source,
//     settle, release the lease); then everything left is cut.
//  2. The lease release of a step-down still running at the cut, bounded
//     like every step-down phase by min(5s, step_down_grace), so by 5s.
//  3. The HTTP server (/live, /ready, /metrics) shuts down within 5s.
//
// A process killed earlier loses the messages still in flight (the broker
// redelivers them to the successor, at least once) and leaves its lease to
// expire instead of releasing it, so the standby waits out the owner-death
// budget instead of taking over at once.
package stopbound

import (
	"fmt"
	"math"
	"time"

	"github.com/myriarch/myriarch/failover"
)

// HTTPShutdown is how long the bridge waits for its HTTP server to stop
// (cmd/myriarch-bridge, run).
const HTTPShutdown = 5 * time.Second

// ReleaseBound is the longest lease release after the cut: the step-down
// phase bound min(5s, step_down_grace) at any step_down_grace.
var ReleaseBound = failover.Cadence{StepDownGrace: math.MaxInt64}.StepDownPhaseBound()

// Stop returns shutdown_timeout + ReleaseBound + HTTPShutdown rounded up to
// whole seconds (supervisors count seconds): 40s at the default 30s.
func Stop(shutdownTimeout time.Duration) (time.Duration, error) {
	if shutdownTimeout <= 0 {
		return 0, fmt.Errorf("bridge.shutdown_timeout: %v: must be positive", shutdownTimeout)
	}
	if shutdownTimeout > time.Duration(math.MaxInt64)-ReleaseBound-HTTPShutdown-time.Second {
		return 0, fmt.Errorf("bridge.shutdown_timeout: %v: too large", shutdownTimeout)
	}
	d := shutdownTimeout + ReleaseBound + HTTPShutdown
	return (d + time.Second - 1).Truncate(time.Second), nil
}
