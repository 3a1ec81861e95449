package config

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

const good = `
bridge:
  id: plant-bridge
  instance_id: a
  deployment_mode: standalone
  http: {listen: "127.0.0.1:0"}
stores:
  lease: {type: sqlite, path: /tmp/lease.db}
sessions:
  - id: plant
    session_mode: exclusive
    brokers: ["tcp://127.0.0.1:1883"]
    client_id: plant-bridge
    connect_timeout: 2s
    reconcile_timeout: 2s
    unmatched_grace: 1s
receivers:
  - id: telemetry
    session: plant
    topics:
      - {filter: "plant/+/telemetry", qos: 1}
senders:
  - id: archive
    type: file
    file: {path: /tmp/archive.jsonl}
routes:
  - id: telemetry-archive
    receiver: telemetry
    senders: [archive]
    rewrite: {strip_prefix: "plant/", add_prefix: "site1/"}
    lease_ttl: 10s
    step_down_grace: 3s
    failover_slo: 120s
    broker_health_step_down: 20s
`

func TestGoodConfig(t *testing.T) {
	cfg, err := Parse("good.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Exclusive) != 1 || cfg.Exclusive[0].SessionID != "plant" {
		t.Fatalf("exclusive sessions: %+v", cfg.Exclusive)
	}
	a := cfg.Exclusive[0].Assessment
	if !a.Admitted() || a.OwnerDeath == nil || a.BrokerPath == nil {
		t.Fatalf("assessment: %+v", a)
	}
	if got := cfg.Sessions[0].Activation.Bound; got != 2*2*time.Second+4*2*time.Second+2*time.Second {
		t.Fatalf("activation bound %v", got)
	}
	if cfg.Sessions[0].CleanStart {
		t.Fatal("an exclusive session must resume its broker session")
	}
	if cfg.Routes[0].MaxInFlight != DefaultMaxInFlight || cfg.Routes[0].AddPrefix != "site1/" {
		t.Fatalf("route: %+v", cfg.Routes[0])
	}
}

// edit replaces old by new in the good config, which must contain old.
func edit(t *testing.T, pairs ...string) string {
	t.Helper()
	s := good
	for i := 0; i < len(pairs); i += 2 {
		if !strings.Contains(s, pairs[i]) {
			t.Fatalf("good config lacks %q", pairs[i])
		}
		s = strings.Replace(s, pairs[i], pairs[i+1], 1)
	}
	return s
}

func TestBadConfigs(t *testing.T) {
	t.Setenv("MYRIARCH_TEST_PW", "s3cret")
	cases := []struct {
		name  string
		edits []string
		want  []string // each must appear in one problem
	}{
		{"unknown key with its path and line", []string{"    client_id: plant-bridge\n", "    client_id: plant-bridge\n    clientid: x\n"},
			[]string{`bad.yaml:14: sessions[0].clientid: unknown key; sessions[0] accepts`}},
		{"unknown top-level key", []string{"bridge:\n", "brige: {}\nbridge:\n"}, []string{`brige: unknown key; the top level accepts bridge, opamp, receivers, routes, senders, sessions, stores`}},
		{"bad duration", []string{"lease_ttl: 10s", "lease_ttl: ten"}, []string{`routes[0].lease_ttl: "ten": must be a Go duration`}},
		{"ttl below minimum", []string{"lease_ttl: 10s", "lease_ttl: 3s"}, []string{`routes[0].lease_ttl: 3s: must be at least 5s for an exclusive session`}},
		{"slo not admitted", []string{"failover_slo: 120s", "failover_slo: 30s"},
			[]string{`routes[0].failover_slo: 30s: the owner-death budget is`, `the broker-path budget is`}},
		{"slo needs broker_health_step_down", []string{"    broker_health_step_down: 20s\n", ""},
			[]string{`routes[0].broker_health_step_down: omitted: failover_slo is declared`}},
		{"bad broker_health_step_down", []string{"broker_health_step_down: 20s", "broker_health_step_down: sometimes"},
			[]string{`routes[0].broker_health_step_down: "sometimes": must be "off" or a positive duration`}},
		{"instance suffix refused for exclusive", []string{"client_id: plant-bridge", "client_id: plant-bridge\n    client_id_suffix: instance"},
			[]string{`sessions[0].client_id_suffix: "instance": is refused for an exclusive session`}},
		{"exclusive needs client_id", []string{"    client_id: plant-bridge\n", ""}, []string{`sessions[0].client_id: is required for an exclusive session`}},
		{"clean_start refused for exclusive", []string{"client_id: plant-bridge", "client_id: plant-bridge\n    clean_start: true"},
			[]string{`sessions[0].clean_start: "true": must be false for a exclusive session`}},
		{"clustered refuses sqlite", []string{"deployment_mode: standalone", "deployment_mode: clustered"},
			[]string{`stores.lease.type: "sqlite": clustered mode needs a shared lease store`}},
		{"clustered non-exclusive needs $share", []string{"deployment_mode: standalone", "deployment_mode: clustered", "session_mode: exclusive", "session_mode: persistent",
			"    lease_ttl: 10s\n    step_down_grace: 3s\n    failover_slo: 120s\n    broker_health_step_down: 20s\n", "",
			"    client_id: plant-bridge\n", "    client_id_suffix: instance\n"},
			[]string{`receivers[0].topics[0].filter: "plant/+/telemetry": in clustered mode a receiver needs a $share/<group>/ filter`}},
		{"lease keys on a non-exclusive session", []string{"session_mode: exclusive", "session_mode: persistent"},
			[]string{`routes[0].lease_ttl: "10s": applies only to routes on an exclusive session`, `routes[0].failover_slo: "120s": applies only`}},
		{"bad filter", []string{`"plant/+/telemetry"`, `"plant/#/x"`}, []string{`receivers[0].topics[0].filter: "plant/#/x": '#' must be a whole level and the last one`}},
		{"bad share", []string{`"plant/+/telemetry"`, `"$share/g"`}, []string{`a shared subscription must be $share/<group>/<filter>`}},
		{"bad qos", []string{"qos: 1}", "qos: 3}"}, []string{`receivers[0].topics[0].qos: 3: must be 0, 1 or 2`}},
		{"unknown refs", []string{"receiver: telemetry", "receiver: nope", "senders: [archive]", "senders: [archive, gone]"},
			[]string{`routes[0].receiver: "nope": names no receiver`, `routes[0].senders[1]: "gone": names no sender`}},
		{"kafka timeout below the client's minimum", []string{"type: file\n    file: {path: /tmp/archive.jsonl}", "type: kafka\n    kafka: {brokers: [\"127.0.0.1:9092\"], topic: t, timeout: 500ms}"},
			[]string{`senders[0].kafka.timeout: "500ms": must be at least 1s (the Kafka client's minimum record delivery timeout)`}},
		{"sender block mismatch", []string{"type: file", "type: http"}, []string{`senders[0].http: is required for a sender of type http`, `senders[0].file: does not apply to a sender of type "http"`}},
		{"bad broker url", []string{"tcp://127.0.0.1:1883", "http://127.0.0.1"}, []string{`sessions[0].brokers[0]: "http://127.0.0.1": scheme must be tcp`}},
		{"zero activation step", []string{"unmatched_grace: 1s", "unmatched_grace: 0s"}, []string{`sessions[0].unmatched_grace: "0s": must be a positive duration`}},
		{"session expiry shorter than budget", []string{"client_id: plant-bridge", "client_id: plant-bridge\n    session_expiry_interval: 10s"},
			[]string{`sessions[0].session_expiry_interval: "10s": must be at least the worst-case failover budget`}},
		{"queue room below the messages at risk", []string{"    failover_slo: 120s\n", "    failover_slo: 120s\n    peak_message_rate: 500\n"},
			[]string{`sessions[0].broker_max_queued_messages: (assumed: the default of mosquitto, EMQX and HiveMQ; declare the broker's real limit) cannot hold the messages at risk: peak_message_rate 500 msg/s × worst-case failover budget`}},
		{"declared queue room too small", []string{"    failover_slo: 120s\n", "    failover_slo: 120s\n    peak_message_rate: 500\n", "unmatched_grace: 1s", "unmatched_grace: 1s\n    broker_max_queued_messages: 20000"},
			[]string{`sessions[0].broker_max_queued_messages: 20000: (declared) cannot hold the messages at risk`}},
		{"bad queue declarations", []string{"    failover_slo: 120s\n", "    failover_slo: 120s\n    peak_message_rate: -5\n", "unmatched_grace: 1s", "unmatched_grace: 1s\n    broker_max_queued_messages: -1"},
			[]string{`routes[0].peak_message_rate: -5: must be a positive number of messages per second`, `sessions[0].broker_max_queued_messages: -1: must be 0 (the broker queues without limit) or a positive number`}},
		{"peak rate on a non-exclusive session", []string{"session_mode: exclusive", "session_mode: persistent", "    failover_slo: 120s\n", "    failover_slo: 120s\n    peak_message_rate: 5\n"},
			[]string{`routes[0].peak_message_rate: "5": applies only to routes on an exclusive session`}},
		{"missing password env", []string{"client_id: plant-bridge", "client_id: plant-bridge\n    username: u\n    password_env: MYRIARCH_NOPE_NOT_SET"},
			[]string{`sessions[0].password_env: "MYRIARCH_NOPE_NOT_SET": names an environment variable that is not set`}},
		{"duplicate ids", []string{"  - id: archive\n", "  - id: archive\n    type: file\n    file: {path: /tmp/x}\n  - id: archive\n"},
			[]string{`senders[1].id: "archive": is already used by senders[0]`}},
		{"bad retain policy", []string{"    senders: [archive]\n", "    senders: [archive]\n    retain: forget\n"},
			[]string{`routes[0].retain: "forget": must be keep, clear or drop`}},
		{"bad mappings", []string{"    senders: [archive]\n", "    senders: [archive]\n    mappings:\n      - {pattern: 'a/#/b', source_prefix: p/}\n      - {pattern: '#', source_prefix: 'q/+/', destination_prefix: 'r/#'}\n      - {source_prefix: s/}\n"},
			[]string{`routes[0].mappings: and rewrite exclude each other`, `routes[0].mappings[0].pattern: "a/#/b": with source_prefix "p/": '#' must be a whole level and the last one`,
				`routes[0].mappings[1].source_prefix: "q/+/": must not contain MQTT wildcards`, `routes[0].mappings[1].destination_prefix: "r/#": must not contain MQTT wildcards`,
				`routes[0].mappings[2].pattern: is required`}},
		{"wrong type", []string{"max_in_flight", "max_in_flight"}, nil}, // placeholder replaced below
		{"all errors at once", []string{"id: plant-bridge", "id: ''", "lease_ttl: 10s", "lease_ttl: -1s", "qos: 1}", "qos: 9}"},
			[]string{`bridge.id: is required`, `routes[0].lease_ttl: "-1s": must not be negative`, `qos: 9: must be 0, 1 or 2`}},
		{"not yaml", []string{"bridge:\n", "bridge: [\n"}, []string{`bad.yaml: not valid YAML`}},
		{"list where mapping expected", []string{"  lease: {type: sqlite, path: /tmp/lease.db}", "  lease: [sqlite]"}, []string{`stores.lease: a list: must be a mapping`}},
	}
	for _, c := range cases {
		if c.name == "wrong type" {
			c.edits = []string{"    senders: [archive]\n", "    senders: [archive]\n    max_in_flight: many\n"}
			c.want = []string{`bad.yaml:30: wrong type: cannot unmarshal !!str ` + "`many`" + ` into int`}
		}
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("bad.yaml", []byte(edit(t, c.edits...)))
			if err == nil {
				t.Fatal("accepted")
			}
			msg := err.Error()
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("missing %q in:\n%s", w, msg)
				}
			}
			for _, line := range strings.Split(msg, "\n") {
				if !strings.HasPrefix(line, "bad.yaml") {
					t.Errorf("problem does not name the file: %q", line)
				}
			}
		})
	}
}

func TestSecretsNeverPrinted(t *testing.T) {
	t.Setenv("MYRIARCH_TEST_PW", "s3cret")
	cfg, err := Parse("good.yaml", []byte(edit(t, "client_id: plant-bridge", "client_id: plant-bridge\n    username: u\n    password_env: MYRIARCH_TEST_PW")))
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Sessions[0]
	if s.Password.Reveal() != "s3cret" {
		t.Fatal("password not read")
	}
	for _, f := range []string{"%v", "%+v", "%#v", "%s"} {
		if strings.Contains(sprintf(f, s), "s3cret") {
			t.Fatalf("%s prints the secret", f)
		}
	}
}

func TestDivergentSharedSession(t *testing.T) {
	y := good + `  - id: second
    receiver: telemetry
    senders: [archive]
    lease_ttl: 20s
    step_down_grace: 3s
    failover_slo: 120s
    broker_health_step_down: 20s
`
	_, err := Parse("bad.yaml", []byte(y))
	if err == nil || !strings.Contains(err.Error(), `disagree on lease_ttl`) {
		t.Fatalf("want divergence, got %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte("bridge: {id: x}\nsessions: [{id: s, brokers: ['tcp://h:1']}]"))
	f.Add([]byte("routes: [{lease_ttl: 1h, broker_health_step_down: off}]"))
	f.Add([]byte("senders: [{id: o, type: http, qos: 1, http: {url: 'http://h', timeout: 1s, qos: 2}, file: {}}]"))
	f.Add([]byte("bridge: {http: {listen: off}}\nstores: {lease: {type: etcd}}\nopamp: {heartbeat_interval: 1ms}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("fuzz.yaml", data)
		if err == nil {
			if cfg == nil || cfg.Bridge.ID == "" || len(cfg.Routes) == 0 {
				t.Fatalf("accepted an incomplete config: %+v", cfg)
			}
			for _, c := range cfg.Exclusive {
				if !c.Assessment.Admitted() {
					t.Fatal("accepted a refused session")
				}
			}
			return
		}
		if cfg != nil {
			t.Fatal("config returned with an error")
		}
		if strings.TrimSpace(err.Error()) == "" {
			t.Fatal("empty error")
		}
	})
}

// TestQueueRoom: the messages at risk are the peak rate times the worst
// failover budget, and a queue that holds them (or no limit) is admitted.
func TestQueueRoom(t *testing.T) {
	for _, c := range []struct {
		limit  string
		want   int
		assume bool
	}{{"", 1000, true}, {"\n    broker_max_queued_messages: 0", 0, false}, {"\n    broker_max_queued_messages: 5000", 5000, false}} {
		cfg, err := Parse("q.yaml", []byte(edit(t, "    failover_slo: 120s\n", "    failover_slo: 120s\n    peak_message_rate: 10\n", "unmatched_grace: 1s", "unmatched_grace: 1s"+c.limit)))
		if err != nil {
			t.Fatalf("limit %q: %v", c.limit, err)
		}
		a := cfg.Exclusive[0].Assessment
		worst := max(a.OwnerDeath.Total, a.BrokerPath.Total)
		q := cfg.QueueRoom["plant"]
		want := int64(10*worst.Seconds() + 0.999999)
		if q.AtRisk != want || q.Budget != worst || q.Limit != c.want || q.LimitAssumed != c.assume || q.Err != nil || q.PeakRate != 10 {
			t.Errorf("limit %q: %+v, want %d at risk over %v", c.limit, q, want, worst)
		}
	}
	cfg, err := Parse("good.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if q := cfg.QueueRoom["plant"]; q.PeakRate != 0 || q.AtRisk != 0 || q.Err != nil {
		t.Errorf("undeclared rate: %+v", q)
	}
}

// Topic mappings and the retain policy reach the route's settings.
func TestMappingsAndRetain(t *testing.T) {
	cfg, err := Parse("good.yaml", []byte(edit(t, `    rewrite: {strip_prefix: "plant/", add_prefix: "site1/"}`,
		"    retain: clear\n    mappings:\n      - {pattern: 'sensors/#', source_prefix: plant/, destination_prefix: site1/}\n      - {pattern: '#', source_prefix: lab/}")))
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Routes[0]
	want := []Mapping{{Pattern: "sensors/#", SourcePrefix: "plant/", DestinationPrefix: "site1/"}, {Pattern: "#", SourcePrefix: "lab/"}}
	if fmt.Sprint(r.Mappings) != fmt.Sprint(want) || r.Retain != "clear" || r.StripPrefix != "" {
		t.Fatalf("route settings %+v", r)
	}
}

// failover names its own fields (LeaseTTL, FailoverSLO, ...); what the
// bridge reports names the route keys.
func TestFailoverWordsAreTheBridgesKeys(t *testing.T) {
	cfg, err := Parse("good.yaml", []byte(edit(t, "    lease_ttl: 10s\n    step_down_grace: 3s\n",
		"    lease_ttl: 30s\n    renew_interval: 6s\n    lease_renew_jitter: 4s\n    renew_call_timeout: 3s\n    step_down_grace: 5s\n",
		"failover_slo: 120s", "failover_slo: 300s")))
	if err != nil {
		t.Fatal(err)
	}
	if !hasWarning(cfg.Warnings, `session "plant": lease_renew_jitter reduced from 4s to 1.999999998s so that max_renew_fails × (renew_interval + lease_renew_jitter/2 + renew_call_timeout) stays below lease_ttl (30s)`) {
		t.Errorf("warnings %q", cfg.Warnings)
	}
	for _, c := range []struct{ edits []string }{
		{[]string{"lease_ttl: 10s", "lease_ttl: 10s\n    renew_interval: 3s\n    renew_call_timeout: 1s", "step_down_grace: 3s", "step_down_grace: 10s"}},
		{[]string{"broker_health_step_down: 20s", "broker_health_step_down: 0s"}},
		{[]string{"    broker_health_step_down: 20s\n", "", "failover_slo: 120s", "failover_slo: 10s"}},
		{[]string{"    rewrite:", "    startup_allowance: 11m\n    rewrite:"}},
	} {
		_, err := Parse("bad.yaml", []byte(edit(t, c.edits...)))
		if err == nil {
			t.Fatalf("%q accepted", c.edits)
		}
		for _, w := range []string{"LeaseTTL", "StepDownGrace", "FailoverSLO", "BrokerHealthStepDown", "StartupAllowance", "RenewInterval", "MaxRenewFails"} {
			if strings.Contains(err.Error(), w) {
				t.Errorf("%q: failover's word %s reaches the operator:\n%v", c.edits, w, err)
			}
		}
	}
}
