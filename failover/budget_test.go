package failover

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// mqttLike declares the shipped MQTT transport's steps (its formula lives
// in internal/bridge/activation, which this package cannot import).
func mqttLike(connect, reconcile, unmatched time.Duration) (Activation, error) {
	return DeclareActivation("mqtt",
		ActivationStep{Name: "connect_timeout", Times: 2, Timeout: connect},
		ActivationStep{Name: "reconcile_timeout", Times: 4, Timeout: reconcile},
		ActivationStep{Name: "unmatched_grace", Times: 2, Timeout: unmatched})
}

func mustMQTT(t testing.TB) Activation {
	t.Helper()
	a, err := mqttLike(30*time.Second, 30*time.Second, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The spec's profile table: both shipped baselines at the MQTT defaults and
// startup_allowance 0s.
func TestShippedProfilesMatchSpec(t *testing.T) {
	act := mustMQTT(t)
	if act.Bound != 240*time.Second {
		t.Fatalf("MQTT activation at defaults = %v, want 240s", act.Bound)
	}
	step := 90 * time.Second
	for _, tc := range []struct {
		base                       Baseline
		ttl, interval, call, poll  time.Duration
		grace                      time.Duration
		ownerDeath, brokerPathRest time.Duration
	}{
		{standaloneBase, 360 * time.Second, 75555555555, 5 * time.Second, 5 * time.Second, 15 * time.Second, 1097500 * time.Millisecond, 382500 * time.Millisecond},
		{clusteredBase, 45 * time.Second, 10 * time.Second, 3 * time.Second, 5 * time.Second, 5 * time.Second, 336500 * time.Millisecond, 290 * time.Second},
	} {
		t.Run(tc.base.Name, func(t *testing.T) {
			bh, _ := BrokerHealthAfter(step)
			a := Assess(SessionPolicy{Lease: LeaseConfig{Baseline: tc.base}, BrokerHealthStepDown: bh, Activation: act})
			if !a.Admitted() {
				t.Fatal(a.Err)
			}
			c := a.Cadence
			if c.LeaseTTL != tc.ttl || c.RenewInterval != tc.interval || c.RenewCallTimeout != tc.call || c.AcquirePollInterval != tc.poll || c.StepDownGrace != tc.grace {
				t.Fatalf("cadence %+v", c)
			}
			if a.OwnerDeath.Total != tc.ownerDeath {
				t.Errorf("owner-death budget %v, want %v (%v)", a.OwnerDeath.Total, tc.ownerDeath, a.OwnerDeath)
			}
			if got := a.BrokerPath.Total - step; got != tc.brokerPathRest {
				t.Errorf("broker-path budget step_down + %v, want + %v (%v)", got, tc.brokerPathRest, a.BrokerPath)
			}
		})
	}
}

func TestOwnerDeathTerms(t *testing.T) {
	c, _, err := ResolveCadence(LeaseConfig{Baseline: standaloneBase})
	if err != nil {
		t.Fatal(err)
	}
	if c.MinJitteredPoll() != 3750*time.Millisecond || c.MaxJitteredPoll() != 6250*time.Millisecond {
		t.Fatalf("jittered polls %v %v", c.MinJitteredPoll(), c.MaxJitteredPoll())
	}
	b, err := OwnerDeathBudget(c, mustMQTT(t), 7*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// 1 + ⌈360/3.75⌉ = 97 calls.
	if b.Terms[2].Name != "97 × renew_call_timeout" || b.Terms[2].Value != 485*time.Second {
		t.Fatalf("observation term %+v", b.Terms[2])
	}
	if b.Total != 1104500*time.Millisecond {
		t.Fatalf("total %v", b.Total)
	}
}

func TestSLOAdmission(t *testing.T) {
	act := mustMQTT(t)
	bh90, _ := BrokerHealthAfter(90 * time.Second)
	clustered := LeaseConfig{Baseline: clusteredBase}
	for _, tc := range []struct {
		name    string
		p       SessionPolicy
		wantErr string // "" = admitted
	}{
		{"exact owner-death boundary passes", SessionPolicy{Lease: clustered, FailoverSLO: 336500 * time.Millisecond, BrokerHealthStepDown: BrokerHealthOff, Activation: act}, ""},
		{"1ms below refused", SessionPolicy{Lease: clustered, FailoverSLO: 336499 * time.Millisecond, BrokerHealthStepDown: BrokerHealthOff, Activation: act}, "owner-death budget is 5m36.5s"},
		{"omitted step-down refused with SLO", SessionPolicy{Lease: clustered, FailoverSLO: time.Hour, Activation: act}, "BrokerHealthStepDown: omitted"},
		{"omitted is fine without SLO", SessionPolicy{Lease: clustered, Activation: act}, ""},
		{"duration: broker path must fit", SessionPolicy{Lease: clustered, FailoverSLO: 379 * time.Second, BrokerHealthStepDown: bh90, Activation: act}, "broker-path budget is 6m20s"},
		{"duration: exact broker-path boundary passes", SessionPolicy{Lease: clustered, FailoverSLO: 380 * time.Second, BrokerHealthStepDown: bh90, Activation: act}, ""},
		{"unknown activation with SLO refused", SessionPolicy{Lease: clustered, FailoverSLO: time.Hour, BrokerHealthStepDown: BrokerHealthOff, Activation: UnknownActivation("custom")}, `transport "custom" declares no post-takeover activation bound`},
		{"negative SLO", SessionPolicy{Lease: clustered, FailoverSLO: -time.Second, BrokerHealthStepDown: BrokerHealthOff, Activation: act}, "FailoverSLO: -1s: must be a positive duration"},
		{"startup above 10m", SessionPolicy{Lease: clustered, StartupAllowance: 11 * time.Minute, Activation: act}, "StartupAllowance: 11m0s: must be within [0s, 10m0s]"},
		{"startup negative", SessionPolicy{Lease: clustered, StartupAllowance: -1, Activation: act}, "StartupAllowance"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := Assess(tc.p)
			if tc.wantErr == "" {
				if !a.Admitted() {
					t.Fatalf("refused: %v", a.Err)
				}
				return
			}
			if a.Admitted() || !strings.Contains(a.Err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want error containing %q", a.Err, tc.wantErr)
			}
		})
	}
}

func TestOffLeavesBrokerPathUncomputed(t *testing.T) {
	a := Assess(SessionPolicy{Lease: LeaseConfig{Baseline: standaloneBase}, FailoverSLO: 2 * time.Hour, BrokerHealthStepDown: BrokerHealthOff, Activation: mustMQTT(t)})
	if !a.Admitted() || a.BrokerPath != nil || a.OwnerDeath == nil {
		t.Fatalf("off: admitted=%v brokerPath=%v ownerDeath=%v", a.Admitted(), a.BrokerPath, a.OwnerDeath)
	}
}

func TestOverflowIsAnError(t *testing.T) {
	huge := time.Duration(1<<62) + time.Duration(1<<61)
	c := Cadence{LeaseTTL: huge, AcquirePollInterval: time.Second, RenewCallTimeout: time.Second, StepDownGrace: time.Second}
	_, err := OwnerDeathBudget(c, mustMQTT(t), 0)
	if !errors.Is(err, ErrOverflow) {
		t.Fatalf("owner-death with TTL %v: err = %v, want ErrOverflow", huge, err)
	}
	_, err = BrokerPathBudget(Cadence{LeaseTTL: time.Minute, AcquirePollInterval: time.Second, RenewCallTimeout: huge, StepDownGrace: time.Second}, time.Second, mustMQTT(t), 0)
	if !errors.Is(err, ErrOverflow) {
		t.Fatalf("broker-path with call timeout %v: err = %v, want ErrOverflow", huge, err)
	}
	_, err = mqttLike(huge, time.Second, time.Second)
	if !errors.Is(err, ErrOverflow) {
		t.Fatalf("activation: %v", err)
	}
	// Resolution of a pinned TTL near the limit must not wrap either.
	a := Assess(SessionPolicy{Lease: LeaseConfig{Baseline: standaloneBase, LeaseTTL: huge}, Activation: mustMQTT(t)})
	if a.Admitted() {
		t.Fatalf("TTL %v admitted with budget %v", huge, a.OwnerDeath)
	}
}

func TestBrokerHealthParse(t *testing.T) {
	for in, want := range map[string]string{"": "undeclared", "off": "off", "90s": "1m30s", " 2m ": "2m0s"} {
		b, err := ParseBrokerHealthStepDown(in)
		if err != nil || b.String() != want {
			t.Errorf("%q: %v %v, want %s", in, b, err, want)
		}
	}
	for _, in := range []string{"0s", "-5s", "on", "5", "OFF"} {
		if _, err := ParseBrokerHealthStepDown(in); err == nil || !strings.Contains(err.Error(), "BrokerHealthStepDown") {
			t.Errorf("%q accepted or unclear error: %v", in, err)
		}
	}
}

// A refused objective still discloses the budgets it was compared with.
func TestRefusedPolicyStillDisclosesBudgets(t *testing.T) {
	a := Assess(SessionPolicy{Lease: LeaseConfig{Baseline: clusteredBase}, FailoverSLO: time.Minute, Activation: mustMQTT(t)})
	if a.Admitted() || a.OwnerDeath == nil || a.OwnerDeath.Total != 336500*time.Millisecond {
		t.Fatalf("admitted=%v ownerDeath=%v err=%v", a.Admitted(), a.OwnerDeath, a.Err)
	}
	if got := ErrorStrings(a.Err); len(got) != 2 {
		t.Fatalf("want the undeclared step-down and the missed objective, got %q", got)
	}
}
