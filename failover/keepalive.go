package failover

import (
	"fmt"
	"time"
)

// Bounds and default of the leader session timeout T (pgleader.Config.LeaderSessionTimeout).
const (
	MinLeaderSessionTimeout     = 10 * time.Second
	MaxLeaderSessionTimeout     = 10 * time.Minute
	DefaultLeaderSessionTimeout = 30 * time.Second

	// MaxFollowerRetry caps the follower's lock retry.
	MaxFollowerRetry = 5 * time.Second
)

// LeaderKeepalive is everything derived from the leader session timeout T:
// the follower's lock retry, the detection time D within which PostgreSQL
// drops a silent lock session, the TCP parameters that make it do so, and
// the leader's own confirmation cadence.
type LeaderKeepalive struct {
	// T is the leader session timeout.
	T time.Duration
	// FollowerRetry is min(5s, T/6); FollowerRetryMax adds the 20% jitter.
	FollowerRetry    time.Duration
	FollowerRetryMax time.Duration
	// AcquisitionMargin is T/20, rounded up.
	AcquisitionMargin time.Duration
	// Detection is D = T − FollowerRetryMax − AcquisitionMargin, rounded
	// down to whole seconds.
	Detection time.Duration
	// KeepalivesIdle and KeepalivesInterval are I = max(1s, ⌊D/6⌋).
	KeepalivesIdle     time.Duration
	KeepalivesInterval time.Duration
	// KeepalivesCount is D/I − 1.
	KeepalivesCount int
	// UserTimeout is tcp_user_timeout = D − I.
	UserTimeout time.Duration
	// EarliestDrop and LatestDrop bound, after the last packet the server
	// received, when it drops a silent session: D − I and D.
	EarliestDrop time.Duration
	LatestDrop   time.Duration
	// ConfirmInterval (T/6) and ConfirmTimeout (T/3) are the leader's
	// lock-session check; ResignAfter (T/2) is the latest time after the
	// last answer at which the leader gives up by itself.
	ConfirmInterval time.Duration
	ConfirmTimeout  time.Duration
	ResignAfter     time.Duration
}

// DeriveLeaderKeepalive derives the lock-session parameters from the leader
// session timeout T (pgleader's Config.LeaderSessionTimeout; myriarchd's
// ha.leaderSessionTimeout). T must lie within [10s, 10m]; errors name the
// field LeaderSessionTimeout, which a daemon maps onto its own key; fractional seconds are allowed. Every rounding is
// in the safe direction: parts subtracted from T round up, D and I round
// down to whole seconds.
func DeriveLeaderKeepalive(t time.Duration) (LeaderKeepalive, error) {
	if t < MinLeaderSessionTimeout || t > MaxLeaderSessionTimeout {
		return LeaderKeepalive{}, fieldErr("LeaderSessionTimeout", t, "must be within [%v, %v]", MinLeaderSessionTimeout, MaxLeaderSessionTimeout)
	}
	k := LeaderKeepalive{T: t}
	k.FollowerRetry = min(MaxFollowerRetry, t/6)
	k.FollowerRetryMax = k.FollowerRetry + time.Duration(ceilDiv(int64(k.FollowerRetry), 5))
	k.AcquisitionMargin = time.Duration(ceilDiv(int64(t), 20))
	k.Detection = (t - k.FollowerRetryMax - k.AcquisitionMargin).Truncate(time.Second)
	i := max(time.Second, (k.Detection / 6).Truncate(time.Second))
	k.KeepalivesIdle, k.KeepalivesInterval = i, i
	k.KeepalivesCount = int(k.Detection/i) - 1
	k.UserTimeout = k.Detection - i
	k.EarliestDrop = k.Detection - i
	k.LatestDrop = k.Detection
	k.ConfirmInterval = t / 6
	k.ConfirmTimeout = t / 3
	k.ResignAfter = t / 2
	if k.KeepalivesCount < 1 || k.EarliestDrop <= k.ResignAfter {
		// Cannot happen within the accepted range; the model test proves it.
		return LeaderKeepalive{}, fmt.Errorf("LeaderSessionTimeout %v: derived keepalives are inconsistent (count %d, earliest drop %v, resign %v)",
			t, k.KeepalivesCount, k.EarliestDrop, k.ResignAfter)
	}
	return k, nil
}

// RuntimeParams returns the startup-packet parameters for the lock and
// listener sessions. withUserTimeout false leaves out tcp_user_timeout for
// servers that refuse it.
func (k LeaderKeepalive) RuntimeParams(withUserTimeout bool) map[string]string {
	p := map[string]string{
		"tcp_keepalives_idle":     fmt.Sprint(int64(k.KeepalivesIdle / time.Second)),
		"tcp_keepalives_interval": fmt.Sprint(int64(k.KeepalivesInterval / time.Second)),
		"tcp_keepalives_count":    fmt.Sprint(k.KeepalivesCount),
	}
	if withUserTimeout {
		p["tcp_user_timeout"] = fmt.Sprint(k.UserTimeout.Milliseconds())
	}
	return p
}

// LinuxDropAfter models the Linux keepalive timer with tcp_user_timeout
// set: the first probe goes out after the idle time, one more every
// interval, and at each timer expiry with a probe outstanding the
// connection is dropped once the time since the last received packet has
// reached the user timeout. It returns that drop time after the last
// received packet.
func (k LeaderKeepalive) LinuxDropAfter() time.Duration {
	elapsed, probesOut := k.KeepalivesIdle, 0
	for {
		if probesOut > 0 && elapsed >= k.UserTimeout {
			return elapsed
		}
		probesOut++
		elapsed += k.KeepalivesInterval
	}
}

// CountDropAfter models a server without tcp_user_timeout: it drops the
// connection at the timer expiry that finds count probes unanswered, that
// is after idle + count × interval.
func (k LeaderKeepalive) CountDropAfter() time.Duration {
	elapsed, probesOut := k.KeepalivesIdle, 0
	for probesOut < k.KeepalivesCount {
		probesOut++
		elapsed += k.KeepalivesInterval
	}
	return elapsed
}

// LeaderReleaseBound bounds the leader's unlock and session close (4s)
// plus the pool and listener close (about 1s).
const LeaderReleaseBound = 5 * time.Second

// TerminationGracePeriod is the smallest stop time (Kubernetes'
// terminationGracePeriodSeconds, systemd's TimeoutStopSec) that covers the
// slowest planned stop of a leader-elected service whose stop sleeps
// preStopSleep, drains twice for shutdownTimeout, gives its last flush
// finalFlush and releases the leadership:
// preStopSleep + 2 × shutdownTimeout + finalFlush + LeaderReleaseBound,
// rounded up to whole seconds. The daemon supplies its own values
// (myriarchd: internal/fleet/config).
func TerminationGracePeriod(preStopSleep, shutdownTimeout, finalFlush time.Duration) (time.Duration, error) {
	if preStopSleep < 0 {
		return 0, fieldErr("PreStopSleep", preStopSleep, "must not be negative")
	}
	if shutdownTimeout <= 0 {
		return 0, fieldErr("ShutdownTimeout", shutdownTimeout, "must be positive")
	}
	if finalFlush < 0 {
		return 0, fieldErr("FinalFlush", finalFlush, "must not be negative")
	}
	var s sum
	s.add("pre-stop sleep", preStopSleep)
	v, err := mul("2 × shutdown timeout", 2, shutdownTimeout)
	if err != nil {
		return 0, err
	}
	s.add("2 × shutdown timeout", v)
	s.add("final flush", finalFlush)
	s.add("leader release", LeaderReleaseBound)
	if s.err != nil {
		return 0, s.err
	}
	g := s.total.Truncate(time.Second)
	if g < s.total {
		g += time.Second
	}
	return g, nil
}
