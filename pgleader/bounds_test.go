package pgleader

import (
	"testing"

	"github.com/myriarch/myriarch/failover"
)

// The shutdown sizing of the spec counts 5 s for the leader: the unlock and
// close of the lock session (ReleaseTimeout, 4 s) and the close of the pool
// and the listener (about 1 s). failover cannot import pgleader, so this
// test is what keeps the two numbers together.
func TestLeaderReleaseBoundIsReleaseTimeoutPlusListenerClose(t *testing.T) {
	if got := ReleaseTimeout + ListenerCloseTimeout; got != failover.LeaderReleaseBound {
		t.Fatalf("ReleaseTimeout %v + ListenerCloseTimeout %v = %v, but failover.LeaderReleaseBound is %v",
			ReleaseTimeout, ListenerCloseTimeout, got, failover.LeaderReleaseBound)
	}
}
