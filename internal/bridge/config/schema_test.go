package config

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// The tables and the raw types of raw.go name the same keys with
// compatible types: the walk (tables) and the decoder (raw types) must
// accept the same documents.
func TestTablesMatchRawTypes(t *testing.T) {
	checkTable(t, &topTable, reflect.TypeFor[File](), "")
}

func checkTable(t *testing.T, tab *Table, typ reflect.Type, path string) {
	t.Helper()
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	tags := yamlTags(typ)
	slices.Sort(tags)
	if keys := tab.keys(); !slices.Equal(keys, tags) {
		t.Errorf("%s: table keys %v, raw type %s has %v", orRoot(path), keys, typ, tags)
		return
	}
	for _, k := range tags {
		ft := typ.FieldByIndex(fieldIndex(typ, k)).Type
		p := join(path, k)
		row, sub, _ := tab.child(k, p)
		switch {
		case row == nil || row.Kind == Object:
			checkTable(t, sub, ft, p)
		case row.Kind == Objects:
			checkTable(t, row.Table, ft.Elem(), p+"[]")
		default:
			want := map[Kind][]reflect.Kind{String: {reflect.String}, Duration: {reflect.String}, Int: {reflect.Int}, Number: {reflect.Float64},
				Bool: {reflect.Bool}, Strings: {reflect.Slice}, StringMap: {reflect.Map}}[row.Kind]
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if !slices.Contains(want, ft.Kind()) {
				t.Errorf("%s: row kind %s, raw field type %s", p, row.Kind, ft)
			}
		}
	}
}

// Every row's default is a value its own rule accepts, and the engine's
// rule texts are set for every rule a row declares.
func TestRowDefaultsPassTheirRules(t *testing.T) {
	for _, ref := range Reference {
		for _, r := range ref.Table.Rows {
			if r.Default == "" {
				continue
			}
			var raw any = r.Default
			switch r.Kind {
			case Int, Number, Bool:
				raw = r.defaultValue()
			}
			if _, rule := r.check(raw); rule != "" {
				t.Errorf("%s.%s: default %q breaks its rule: %s", ref.Name, r.Key, r.Default, rule)
			}
			if r.Rule.Required != "" {
				t.Errorf("%s.%s: a required key with a default", ref.Name, r.Key)
			}
		}
	}
}

// A key of another sender type is refused naming the sender, the key and
// the type it belongs to, in the block of the wrong type and beside the
// blocks; the config is not half-accepted.
func TestSenderFieldOfAnotherType(t *testing.T) {
	for _, c := range []struct{ name, sender, want string }{
		{"in the block", `{id: out, type: http, http: {url: "http://h:1/x", qos: 1}}`,
			`bad.yaml:26: senders[1].http.qos: sender "out" (type http): field "qos" belongs to type mqtt`},
		{"beside the block", `{id: out, type: http, qos: 1, http: {url: "http://h:1/x"}}`,
			`senders[1].qos: sender "out" (type http): field "qos" belongs to type mqtt`},
		{"its own field beside its block", `{id: out, type: kafka, topic: t, kafka: {brokers: ["h:1"], topic: t}}`,
			`senders[1].topic: sender "out" (type kafka): field "topic" belongs in its kafka block`},
		{"shared by several types", `{id: out, type: file, file: {path: /tmp/x, timeout: 1s}}`,
			`senders[1].file.timeout: sender "out" (type file): field "timeout" belongs to type mqtt, http, nats, kafka, amqp or sqs`},
		{"truly unknown", `{id: out, type: file, file: {path: /tmp/x, colour: red}}`,
			`senders[1].file.colour: unknown key; senders[1].file accepts path`},
	} {
		t.Run(c.name, func(t *testing.T) {
			y := edit(t, "    file: {path: /tmp/archive.jsonl}\n", "    file: {path: /tmp/archive.jsonl}\n  - "+c.sender+"\n")
			cfg, err := Parse("bad.yaml", []byte(y))
			if err == nil || cfg != nil {
				t.Fatalf("accepted: %+v", cfg)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("missing %q in:\n%v", c.want, err)
			}
		})
	}
}

// Each sender type's settings arrive in its own struct, the others nil.
func TestPerTypeSenderSettings(t *testing.T) {
	y := edit(t, "    file: {path: /tmp/archive.jsonl}\n", `    file: {path: /tmp/archive.jsonl}
  - {id: m, type: mqtt, mqtt: {broker: "tcp://h:1883", qos: 0}}
  - {id: h, type: http, http: {url: "https://h/x", headers: {A: b}, timeout: 2s}}
  - {id: n, type: nats, nats: {url: "nats://h:4222", subject_prefix: p}}
  - {id: k, type: kafka, kafka: {brokers: ["h:9092"], topic: t}}
`)
	cfg, err := Parse("good.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	f, m, h, n, k := cfg.Sender("archive"), cfg.Sender("m"), cfg.Sender("h"), cfg.Sender("n"), cfg.Sender("k")
	switch {
	case f.File == nil || f.File.Path != "/tmp/archive.jsonl" || f.MQTT != nil || f.HTTP != nil:
		t.Errorf("file sender %+v", f)
	case m.MQTT == nil || m.MQTT.QoS != 0 || m.MQTT.ClientID != "plant-bridge-m" || m.MQTT.Timeout != DefaultSenderTimeout || m.MQTT.ProtocolVersion != MQTT5 || m.File != nil:
		t.Errorf("mqtt sender %+v %+v", m, m.MQTT)
	case h.HTTP == nil || h.HTTP.Headers["A"] != "b" || h.HTTP.Timeout.Seconds() != 2 || h.MQTT != nil:
		t.Errorf("http sender %+v", h)
	case n.NATS == nil || n.NATS.SubjectPrefix != "p" || n.NATS.Timeout != DefaultSenderTimeout:
		t.Errorf("nats sender %+v", n)
	case k.Kafka == nil || k.Kafka.Topic != "t" || len(k.Kafka.Brokers) != 1 || k.MaxAttempts != DefaultRetryAttempts:
		t.Errorf("kafka sender %+v", k)
	}
}

// Every row's destination holds the Go type of its kind, and the rows of a
// table store into one Go type (init panics otherwise; this names it).
// Every table of the reference is reached from the top level.
func TestRowDestinations(t *testing.T) {
	seen := map[*Table]bool{}
	if err := checkTables(&topTable, seen); err != nil {
		t.Fatal(err)
	}
	for _, ref := range Reference {
		if !seen[ref.Table] {
			t.Errorf("%s: not reached from the top level, its destinations are unchecked", ref.Name)
		}
	}
}

// The check refuses a destination of another Go type than the row's kind,
// and a table whose rows store into different Go types.
func TestRowDestinationsRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		rows []Row
		want string
	}{
		{"kind", []Row{{Key: "keep_alive", Kind: Duration, To: to(func(s *SessionSettings) *string { return &s.ClientID })}},
			"x.keep_alive: the row of kind duration stores a string, not a time.Duration"},
		{"table", []Row{
			{Key: "a", Kind: String, To: to(func(s *SessionSettings) *string { return &s.ClientID })},
			{Key: "b", Kind: String, To: to(func(s *RouteSettings) *string { return &s.Retain })}},
			"x.b: stores into *config.RouteSettings, the other rows of the table into *config.SessionSettings"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := checkTables(&Table{Name: "x", Rows: c.rows}, map[*Table]bool{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
}

// The exclusive-only rows, refused on a route of a session that is not
// exclusive, are the keys of the lease policy (the list that the check
// named before the rows carried the flag).
func TestExclusiveOnlyRows(t *testing.T) {
	var keys []string
	for _, r := range leaseRows {
		keys = append(keys, r.Key)
	}
	want := []string{"acquire_poll_interval", "broker_health_step_down", "connect_after_lease", "failover_slo", "lease_renew_jitter",
		"lease_ttl", "max_renew_fails", "peak_message_rate", "renew_call_timeout", "renew_interval", "startup_allowance", "step_down_grace"}
	if !slices.Equal(keys, want) {
		t.Fatalf("exclusive-only route keys %v, want %v", keys, want)
	}
}

// The amqp and sqs blocks: their defaults, their secrets, and problems
// that name the key, the value and the rule.
func TestAMQPAndSQSSenderSettings(t *testing.T) {
	t.Setenv("TEST_AMQP_PW", "pw")
	t.Setenv("TEST_SQS_SECRET", "sk")
	y := edit(t, "    file: {path: /tmp/archive.jsonl}\n", `    file: {path: /tmp/archive.jsonl}
  - {id: a, type: amqp, amqp: {url: "amqp://h:5672/v", username: u, password_env: TEST_AMQP_PW, exchange: x}}
  - {id: a2, type: amqp, amqp: {url: "amqp://h:5672/", routing_key: "", mandatory: false, timeout: 3s}}
  - {id: q, type: sqs, sqs: {queue_url: "https://sqs.eu-west-1.amazonaws.com/1/b.fifo", region: eu-west-1, access_key_id: AK, secret_access_key_env: TEST_SQS_SECRET}}
  - {id: q2, type: sqs, sqs: {queue_url: "http://127.0.0.1:1/1/q", region: us-east-1, endpoint: "http://127.0.0.1:1", body_encoding: base64}}
`)
	cfg, err := Parse("good.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	a, a2, q, q2 := cfg.Sender("a").AMQP, cfg.Sender("a2").AMQP, cfg.Sender("q").SQS, cfg.Sender("q2").SQS
	if a == nil || a.Password.Reveal() != "pw" || a.RoutingKey != "{topic}" || !a.Mandatory || a.Exchange != "x" || a.Timeout != DefaultSenderTimeout {
		t.Fatalf("amqp a: %+v", a)
	}
	if a2 == nil || a2.RoutingKey != "" || a2.Mandatory || a2.Timeout != 3*time.Second {
		t.Fatalf("amqp a2 (an empty routing key is a value): %+v", a2)
	}
	if q == nil || q.SecretAccessKey.Reveal() != "sk" || q.AccessKeyID != "AK" || q.BodyEncoding != "text" || q.Region != "eu-west-1" {
		t.Fatalf("sqs q: %+v", q)
	}
	if q2 == nil || q2.BodyEncoding != "base64" || q2.Endpoint != "http://127.0.0.1:1" || q2.AccessKeyID != "" {
		t.Fatalf("sqs q2: %+v", q2)
	}

	for _, c := range []struct{ sender, want string }{
		{`{id: out, type: amqp, amqp: {url: "http://h:5672/"}}`, `senders[1].amqp.url: "http://h:5672/": must be an amqp:// or amqps:// URL`},
		{`{id: out, type: amqp, amqp: {url: "amqp://h/", routing_key: "mqtt.{queue}"}}`, `senders[1].amqp.routing_key: "mqtt.{queue}": must be a routing key template: it has an unknown placeholder {queue}`},
		{`{id: out, type: amqp, amqp: {url: "amqp://h/", tls: {}}}`, `senders[1].amqp.tls: applies to an amqps:// url only`},
		{`{id: out, type: amqp, amqp: {url: "amqp://h/", password_env: TEST_NOT_SET_ANYWHERE}}`, `senders[1].amqp.password_env: "TEST_NOT_SET_ANYWHERE": names an environment variable that is not set`},
		{`{id: out, type: sqs, sqs: {queue_url: "https://q/1/x"}}`, `senders[1].sqs.region: is required (the queue's AWS region)`},
		{`{id: out, type: sqs, sqs: {queue_url: "https://q/1/x", region: r, access_key_id: AK}}`, `senders[1].sqs.access_key_id: "AK": needs secret_access_key_env or secret_access_key_file`},
		{`{id: out, type: sqs, sqs: {queue_url: "https://q/1/x", region: r, body_encoding: hex}}`, `senders[1].sqs.body_encoding: "hex": must be text or base64`},
		{`{id: out, type: sqs, sqs: {queue_url: "sqs://q/1/x", region: r}}`, `senders[1].sqs.queue_url: "sqs://q/1/x": must be an http:// or https:// URL`},
	} {
		y := edit(t, "    file: {path: /tmp/archive.jsonl}\n", "    file: {path: /tmp/archive.jsonl}\n  - "+c.sender+"\n")
		cfg, err := Parse("bad.yaml", []byte(y))
		if err == nil || cfg != nil {
			t.Fatalf("%s accepted", c.sender)
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("missing %q in:\n%v", c.want, err)
		}
	}
}
