package failover_test

import (
	"fmt"
	"time"

	"github.com/myriarch/myriarch/failover"
)

// Admit a clustered session against a 6m30s objective with broker-path
// failover after 90s.
func ExampleAssess() {
	// The MQTT transport's steps: 2·connect + 4·reconcile + 2·unmatched.
	act, _ := failover.DeclareActivation("mqtt",
		failover.ActivationStep{Name: "connect_timeout", Times: 2, Timeout: 30 * time.Second},
		failover.ActivationStep{Name: "reconcile_timeout", Times: 4, Timeout: 30 * time.Second},
		failover.ActivationStep{Name: "unmatched_grace", Times: 2, Timeout: 30 * time.Second})
	bh, _ := failover.ParseBrokerHealthStepDown("90s")
	// The baseline the daemon ships (here the bridge's clustered one).
	clustered := failover.Baseline{Name: "clustered", LeaseTTL: 45 * time.Second, RenewInterval: 10 * time.Second,
		LeaseRenewJitter: time.Second, RenewCallTimeout: 3 * time.Second, MaxRenewFails: 3, StepDownGrace: 5 * time.Second}
	a := failover.Assess(failover.SessionPolicy{
		Lease:                failover.LeaseConfig{Baseline: clustered},
		FailoverSLO:          390 * time.Second,
		BrokerHealthStepDown: bh,
		Activation:           act,
	})
	fmt.Println("admitted:", a.Admitted())
	fmt.Println("owner death:", a.OwnerDeath.Total)
	fmt.Println("broker path:", a.BrokerPath.Total)
	// Output:
	// admitted: true
	// owner death: 5m36.5s
	// broker path: 6m20s
}

// Derive the keepalives of myriarchd's lock session for the default T.
func ExampleDeriveLeaderKeepalive() {
	k, _ := failover.DeriveLeaderKeepalive(30 * time.Second)
	fmt.Println(k.RuntimeParams(true))
	fmt.Println("server drops a silent session between", k.EarliestDrop, "and", k.LatestDrop)
	fmt.Println("the leader resigns by itself after", k.ResignAfter)
	// Output:
	// map[tcp_keepalives_count:6 tcp_keepalives_idle:3 tcp_keepalives_interval:3 tcp_user_timeout:19000]
	// server drops a silent session between 19s and 22s
	// the leader resigns by itself after 15s
}

// A derived cadence: from a baseline that ships only the TTL, the failure
// count and the step-down grace (the bridge's standalone one), every other
// timing is derived.
func ExampleResolveCadence() {
	base := failover.Baseline{Name: "standalone", LeaseTTL: 360 * time.Second, MaxRenewFails: 3, StepDownGrace: 15 * time.Second}
	c, warnings, err := failover.ResolveCadence(failover.LeaseConfig{Baseline: base})
	fmt.Println(c.LeaseTTL, c.RenewInterval.Round(time.Millisecond), c.RenewCallTimeout, c.AcquirePollInterval, len(warnings), err)
	// Output: 6m0s 1m15.556s 5s 5s 0 <nil>
}
