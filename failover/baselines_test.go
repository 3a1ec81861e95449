package failover

import "time"

// The bridge's two shipped baselines (docs/failover-budget.md "How the cadence is resolved",
// internal/bridge/leasemode), restated so that the library's tests check
// the spec's figures without the daemon.
var (
	standaloneBase = Baseline{Name: "standalone", LeaseTTL: 360 * time.Second, MaxRenewFails: 3, StepDownGrace: 15 * time.Second}
	clusteredBase  = Baseline{Name: "clustered", LeaseTTL: 45 * time.Second, RenewInterval: 10 * time.Second, LeaseRenewJitter: time.Second,
		RenewCallTimeout: 3 * time.Second, MaxRenewFails: 3, StepDownGrace: 5 * time.Second}
)
