// Package pgleader elects one leader among the replicas of a service that
// share a PostgreSQL database, with a bound on the failover after a hard
// failure of the leader.
//
// The leader is the replica whose dedicated lock session holds the session
// advisory lock Config.LockKey (default 7012024). Everything time-related
// derives from one setting, T = Config.LeaderSessionTimeout
// (ha.leaderSessionTimeout, see failover.DeriveLeaderKeepalive):
//
//   - The lock session (and the LISTEN/NOTIFY listener session opened with
//     Elector.Listen or Elector.ConnectSession) send tcp_keepalives_idle, _interval, _count
//     and tcp_user_timeout in the startup packet, so that PostgreSQL drops
//     a silent session between D − I and D after the last packet it
//     received. Ordinary pooled connections keep the server defaults. A
//     server that refuses tcp_user_timeout is used without it (one warning).
//   - Followers wait on the lock itself: their lock session queues in
//     pg_advisory_lock, bounded by lock_timeout = min(5s, T/6) plus up to
//     20 % jitter, so the server hands a follower the lock the moment the
//     holder unlocks or its session ends (planned stop, kill -9, crash, a
//     session the server dropped by its keepalives). Between two waits the
//     follower runs the frozen-leader check below; the jittered interval
//     therefore keeps its role in every bound, which the fast path beats.
//   - The leader confirms its lock session every T/6 (timeout T/3) and
//     resigns at the latest T/2 after the last answer: it cancels the
//     leader context, sets myriarch_leader to 0, ends its own lock session
//     with pg_terminate_backend through the pool, and campaigns again.
//   - A planned stop (cancel the context of Run) unlocks and closes the
//     lock session within 4 seconds.
//
// Beyond the keepalive bound, which needs a peer that has gone silent, a
// leader process that is frozen (SIGSTOP, a long pause) keeps its connection
// alive. Followers therefore read the registry heartbeat of the lock holder
// and end its lock session by pid when it is older than T. A frozen leader
// that wakes up must not act on its old term: Config.OnElected receives the
// term's Leadership, and every write of a leader job goes through its
// InTerm (or Fence in a caller's transaction), which locks the term row FOR
// SHARE and fails with a *StaleTermError (errors.Is(err, ErrStaleTerm))
// unless that very term is still current and its lock session still holds
// the lock. Leadership is observed through the callbacks (OnElected,
// OnDemoted) and, for status pages, Elector.IsLeader and Elector.Term,
// which check the time of the last answer against Config.Clock. A new leader
// increments the term under an exclusive row lock, so fenced writes of two
// terms never interleave; fenced transactions of the old term that block it
// for longer than 300 ms are ended.
//
// Elector.Listen keeps the LISTEN/NOTIFY listener session. The registry
// (Elector.Replicas, ReadReplicas, PruneReplicas) shows every replica with
// its heartbeat, marks stale rows and tells which one holds the lock.
// Metrics go to Config.Registerer: myriarch_leader, myriarch_leader_term,
// myriarch_leader_elections_total, myriarch_leader_resignations_total
// {reason} and myriarch_leader_stale_sessions_ended_total.
//
// The bounds of each kind of failure are HardFailureBound (T),
// FrozenLeaderBound, CleanCloseBound and PlannedStopBound; the operators'
// page is docs/leader-election.md, the measurements come from
// `myriarch-lab leader`.
//
// Tables (created by EnsureSchema, which Run calls):
//
//	myriarch_leader_term (lock_key PK, term, leader_id, lock_pid, elected_at)
//	myriarch_replicas    ((lock_key, id) PK, host, version, started_at,
//	                      last_heartbeat, is_leader, lock_pid)
//
// Other packages do not write SQL against them: CurrentTerm,
// TermCommitTime, ReadReplicas, PruneReplicas and CheckTerm take a pool, a
// connection or a transaction (DB). The registry is keyed by the lock key,
// so services with different keys in one database neither list nor prune
// each other's replicas.
package pgleader
