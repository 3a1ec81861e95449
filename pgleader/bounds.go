package pgleader

import (
	"time"

	"github.com/myriarch/myriarch/failover"
)

// FrozenLeaderMargin covers, after a follower decided that the leader's
// heartbeat is stale, ending the old lock session (pg_terminate_backend
// waits up to the acquisition margin T/20 for the backend to exit), ending
// fenced transactions of the old term that block the new term (after
// blockerGrace), and the round trips of taking the lock and starting the
// term.
func FrozenLeaderMargin(k failover.LeaderKeepalive) time.Duration {
	return k.AcquisitionMargin + time.Second
}

// FrozenLeaderBound is the longest time from the moment a leader process
// freezes (SIGSTOP, VM pause; its TCP connections stay up) until another
// replica leads:
//
//	T + FollowerRetryMax + FrozenLeaderMargin
//
// The frozen leader's last heartbeat (its last confirmation on the lock
// session, at most T/6 before the freeze) becomes older than T at the
// latest T after the freeze; a follower looks at the next retry, at most
// FollowerRetryMax later, and then ends the frozen session and takes the
// lock within the margin. With T = 30s: 30 + 6 + 2.5 = 38.5s; with T = 10s:
// 10 + 2 + 1.5 = 13.5s.
func FrozenLeaderBound(k failover.LeaderKeepalive) time.Duration {
	return k.T + k.FollowerRetryMax + FrozenLeaderMargin(k)
}

// HardFailureBound is the failover bound after a hard failure that the
// server detects by its keepalives: T (ha.leaderSessionTimeout).
func HardFailureBound(k failover.LeaderKeepalive) time.Duration { return k.T }

// CleanCloseBound is the longest handover after the leader's session ended
// with a FIN or RST (kill -9, crash, container killed): the follower's
// longest retry plus the acquisition margin.
func CleanCloseBound(k failover.LeaderKeepalive) time.Duration {
	return k.FollowerRetryMax + k.AcquisitionMargin
}

// PlannedStopBound is the longest handover after a planned stop: the
// release (at most ReleaseTimeout) and then the follower's longest retry
// plus the acquisition margin.
func PlannedStopBound(k failover.LeaderKeepalive) time.Duration {
	return ReleaseTimeout + CleanCloseBound(k)
}
