package config

import (
	"reflect"
	"strings"
	"testing"
)

// twoRoutes is an exclusive session with two routes; lease holds the lease
// keys of the session (indented as session keys), route0 and route1 those
// of each route (indented as route keys).
func twoRoutes(lease, route0, route1 string) string {
	return `
bridge: {id: plant-bridge, instance_id: a, deployment_mode: clustered, http: {listen: "127.0.0.1:0"}}
stores:
  lease: {type: postgres, dsn: "postgres://x@db/lease"}
sessions:
  - id: plant
    session_mode: exclusive
    brokers: ["tcp://127.0.0.1:1883"]
    client_id: plant-bridge
    connect_timeout: 2s
    reconcile_timeout: 2s
    unmatched_grace: 1s
` + lease + `
receivers:
  - {id: telemetry, session: plant, topics: [{filter: "plant/+/telemetry"}]}
  - {id: alarms, session: plant, topics: [{filter: "plant/+/alarms"}]}
senders:
  - {id: archive, type: file, file: {path: /tmp/archive.jsonl}}
routes:
  - id: telemetry-archive
    receiver: telemetry
    senders: [archive]
` + route0 + `
  - id: alarms-archive
    receiver: alarms
    senders: [archive]
` + route1
}

const (
	sessionLease = `    lease_ttl: 20s
    step_down_grace: 4s
    acquire_poll_interval: 2s
    failover_slo: 20m
    broker_health_step_down: 30s
    startup_allowance: 5s`
	routeLease = `    lease_ttl: 20s
    step_down_grace: 4s
    acquire_poll_interval: 2s
    failover_slo: 20m
    broker_health_step_down: 30s
    startup_allowance: 5s`
)

// Lease keys declared once on the session, and two routes that declare
// none, are admitted with the same policy and the same budgets as the
// per-route form; the remote check (myriarchd's) accepts the new form too.
func TestSessionLeaseKeysInheritedByRoutes(t *testing.T) {
	perRoute, err := Parse("per-route.yaml", []byte(twoRoutes("", routeLease, routeLease)))
	if err != nil {
		t.Fatal(err)
	}
	onSession, err := Parse("on-session.yaml", []byte(twoRoutes(sessionLease, "", "")))
	if err != nil {
		t.Fatal(err)
	}
	if len(onSession.Exclusive) != 1 || len(perRoute.Exclusive) != 1 {
		t.Fatalf("exclusive sessions: %d and %d", len(onSession.Exclusive), len(perRoute.Exclusive))
	}
	a, b := onSession.Exclusive[0].Assessment, perRoute.Exclusive[0].Assessment
	if !a.Admitted() || a.OwnerDeath == nil || a.BrokerPath == nil {
		t.Fatalf("session form not admitted: %+v", a)
	}
	if a.OwnerDeath.Total != b.OwnerDeath.Total || a.BrokerPath.Total != b.BrokerPath.Total {
		t.Fatalf("budgets: session form %v/%v, per-route form %v/%v", a.OwnerDeath.Total, a.BrokerPath.Total, b.OwnerDeath.Total, b.BrokerPath.Total)
	}
	for i := range 2 {
		if !reflect.DeepEqual(*onSession.Routes[i].Policy, *perRoute.Routes[i].Policy) {
			t.Errorf("routes[%d]: policy %+v, per-route form %+v", i, *onSession.Routes[i].Policy, *perRoute.Routes[i].Policy)
		}
	}
	if p := onSession.Routes[0].Policy; p.FailoverSLO.String() != "20m0s" || p.Lease.LeaseTTL.String() != "20s" || p.StartupAllowance.String() != "5s" {
		t.Errorf("inherited policy: %+v", p)
	}
	if err := ValidateRemote("config", twoRoutes(sessionLease, "", "")); err != nil {
		t.Fatalf("the remote check refuses the session form: %v", err)
	}
	// A route that restates a session's value, or overrides it alike on
	// every route, is admitted.
	if _, err := Parse("restated.yaml", []byte(twoRoutes(sessionLease, "    failover_slo: 1200s", ""))); err != nil {
		t.Errorf("a restated value: %v", err)
	}
	if _, err := Parse("both.yaml", []byte(twoRoutes(sessionLease, "    failover_slo: 30m", "    failover_slo: 30m"))); err != nil {
		t.Errorf("an override on every route: %v", err)
	}
}

// An override that disagrees with what another route inherits is refused
// at the overriding key, with its value and the rule; a problem of an
// inherited value is reported once, at the session's key; lease keys on a
// session that is not exclusive are refused there.
func TestSessionLeaseKeysRefused(t *testing.T) {
	for _, c := range []struct {
		name, doc string
		want      []string
	}{
		{"override", twoRoutes(sessionLease, "", "    failover_slo: 5m"), []string{
			`routes[1].failover_slo: "5m": differs from failover_slo: 20m of session "plant", which routes[0] "telemetry-archive" inherits; ` +
				`the routes of a session must resolve to the same lease policy: declare it on the session alone, or alike on every route`}},
		{"override first", twoRoutes(sessionLease, "    lease_ttl: 30s", ""), []string{
			`routes[0].lease_ttl: "30s": differs from lease_ttl: 20s of session "plant", which routes[1] "alarms-archive" inherits`}},
		{"inherited budget", twoRoutes(strings.Replace(sessionLease, "failover_slo: 20m", "failover_slo: 30s", 1), "", ""), []string{
			`sessions[0].failover_slo: 30s: the owner-death budget is`}},
		{"inherited grace", twoRoutes(strings.Replace(sessionLease, "step_down_grace: 4s", "step_down_grace: 25s", 1), "", ""), []string{
			`sessions[0].step_down_grace`}},
		{"bad value", twoRoutes(strings.Replace(sessionLease, "lease_ttl: 20s", "lease_ttl: soon", 1), "", ""), []string{
			`sessions[0].lease_ttl: "soon": `}},
		{"not exclusive", strings.Replace(twoRoutes(sessionLease, "", ""), "session_mode: exclusive", "session_mode: persistent", 1), []string{
			`sessions[0].failover_slo: "20m": applies only to exclusive sessions; session "plant" is persistent`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.name+".yaml", []byte(c.doc))
			if err == nil {
				t.Fatal("admitted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got %v\nwant %s", err, w)
				}
				if n := strings.Count(err.Error(), w); n > 1 {
					t.Errorf("%q reported %d times: %v", w, n, err)
				}
			}
			if strings.Contains(err.Error(), "routes[0] \"telemetry-archive\" and routes[1]") && c.name == "override" {
				t.Errorf("the located override is also reported as a bare divergence: %v", err)
			}
			if _, problems := CheckRemote(c.name+".yaml", []byte(c.doc)); problems.Error() != err.Error() {
				t.Errorf("the remote check differs:\n%v\n%v", problems, err)
			}
		})
	}
}
