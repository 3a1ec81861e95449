// Package failover is the arithmetic behind Myriarch's failover guarantees.
//
// It has no I/O. It resolves the lease cadence of an exclusive bridge session
// from its configuration, computes the two failover budgets of the bridge
// (owner death and broker-path outage), admits or refuses a declared
// failover objective against them, canonicalizes the inputs of sessions
// that several routes share, derives the TCP keepalive settings of
// myriarchd's leader lock session from ha.leaderSessionTimeout, and sizes
// the Kubernetes termination grace period.
//
// Every duration is a time.Duration (nanoseconds). Sums and products go
// through checked arithmetic: an overflow is an error, never a wrapped value.
// Budgets are rounded up to the whole millisecond, the direction that keeps
// them upper bounds; admission compares the objective against that rounded
// figure, so the disclosed boundary itself is admitted.
package failover
