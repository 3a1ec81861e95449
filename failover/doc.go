// Package failover is the arithmetic behind Myriarch's failover guarantees.
//
// It has no I/O. It resolves a lease cadence from a baseline and the pinned
// values, computes the two failover budgets of an exclusive session (owner
// death and dependency-path outage), admits or refuses a declared failover
// objective against them, canonicalizes the inputs of sessions that several
// sources share, derives the TCP keepalive settings of a leader lock
// session from its session timeout, and sizes the stop time of a
// leader-elected service.
//
// The daemons own their defaults and policies (the bridge's deployment
// modes and baselines, myriarchd's shutdown defaults) and pass values in.
// Errors are FieldErrors that name this package's own fields (LeaseTTL,
// FailoverSLO, ...); RenameFields and RenameWords state them in a daemon's
// configuration keys.
//
// Every duration is a time.Duration (nanoseconds). Sums and products go
// through checked arithmetic: an overflow is an error, never a wrapped value.
// Budgets are rounded up to the whole millisecond, the direction that keeps
// them upper bounds; admission compares the objective against that rounded
// figure, so the disclosed boundary itself is admitted.
package failover
