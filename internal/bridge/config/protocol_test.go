package config

import (
	"fmt"
	"strings"
	"testing"
)

func TestProtocolVersion(t *testing.T) {
	// Default: MQTT 5 on both sides.
	cfg, err := Parse("good.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Sessions[0].ProtocolVersion != MQTT5 {
		t.Fatalf("default session protocol %q, want 5", cfg.Sessions[0].ProtocolVersion)
	}
	// 3.1.1 on the session (YAML string) and 5 on an mqtt sender (YAML
	// integer): both parse.
	y := edit(t, "    client_id: plant-bridge\n", "    client_id: plant-bridge\n    protocol_version: 3.1.1\n",
		"type: file\n    file: {path: /tmp/archive.jsonl}", "type: mqtt\n    mqtt: {broker: \"tcp://127.0.0.1:1884\", protocol_version: 5}")
	cfg, err = Parse("v311.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Sessions[0].ProtocolVersion != MQTT311 || cfg.Senders[0].MQTT.ProtocolVersion != MQTT5 {
		t.Fatalf("session %q sender %q", cfg.Sessions[0].ProtocolVersion, cfg.Senders[0].MQTT.ProtocolVersion)
	}
	// The broker, not the bridge, keeps a 3.1.1 session: check says so.
	if !hasWarning(cfg.Warnings, `session "plant" speaks MQTT 3.1.1, which has no session expiry interval`) {
		t.Fatalf("no warning about the 3.1.1 session expiry: %q", cfg.Warnings)
	}
}

// A 3.1.1 mqtt sender on an exclusive session is allowed, with a warning
// that its messages travel without the fencing stamp.
func TestProtocolVersion311SenderOnExclusiveSessionWarns(t *testing.T) {
	y := edit(t, "type: file\n    file: {path: /tmp/archive.jsonl}", "type: mqtt\n    mqtt: {broker: \"tcp://127.0.0.1:1884\", protocol_version: 3.1.1}")
	cfg, err := Parse("fence.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Senders[0].MQTT.ProtocolVersion != MQTT311 {
		t.Fatalf("sender protocol %q", cfg.Senders[0].MQTT.ProtocolVersion)
	}
	if !hasWarning(cfg.Warnings, `route "telemetry-archive": sender "archive" publishes MQTT 3.1.1, which has no user properties: the messages of exclusive session "plant" reach it without the fencing stamp`) {
		t.Fatalf("no fencing warning: %q", cfg.Warnings)
	}
}

func hasWarning(ws []string, sub string) bool {
	for _, w := range ws {
		if strings.Contains(w, sub) {
			return true
		}
	}
	return false
}

func TestBadProtocolVersion(t *testing.T) {
	cases := []struct {
		name string
		yaml string
		want []string
	}{
		{"unknown version", edit(t, "    client_id: plant-bridge\n", "    client_id: plant-bridge\n    protocol_version: 3.1\n",
			"type: file\n    file: {path: /tmp/archive.jsonl}", "type: mqtt\n    mqtt: {broker: \"tcp://127.0.0.1:1884\", protocol_version: \"4\"}"),
			[]string{`sessions[0].protocol_version: "3.1": must be 5 or 3.1.1`, `senders[0].mqtt.protocol_version: "4": must be 5 or 3.1.1`}},
		{"MQTT 5 settings on a 3.1.1 session", edit(t, "    client_id: plant-bridge\n", "    client_id: plant-bridge\n    protocol_version: 3.1.1\n    session_expiry_interval: 2h\n    receive_maximum: 100\n"),
			[]string{`sessions[0].session_expiry_interval: "2h": does not apply to protocol_version 3.1.1: MQTT 3.1.1 has no session expiry interval`,
				`sessions[0].receive_maximum: 100: does not apply to protocol_version 3.1.1: MQTT 3.1.1 has no receive maximum`}},
		{"loop pair over a 3.1.1 sender", strings.Replace(pair, `{id: to-b, type: mqtt, mqtt: {broker: "tcp://127.0.0.1:1884"}}`, `{id: to-b, type: mqtt, mqtt: {broker: "tcp://127.0.0.1:1884", protocol_version: 3.1.1}}`, 1),
			[]string{`routes[0].senders[0]: "to-b": publishes MQTT 3.1.1, which has no user properties; a route with loop_peer needs MQTT 5 senders`}},
		{"loop pair over a 3.1.1 session", strings.Replace(pair, `{id: b, brokers: ["tcp://127.0.0.1:1884"]}`, `{id: b, brokers: ["tcp://127.0.0.1:1884"], protocol_version: 3.1.1}`, 1),
			[]string{`routes[1].loop_peer: "a-to-b": needs an MQTT 5 session: session "b" speaks MQTT 3.1.1`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("bad.yaml", []byte(c.yaml))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("missing %q in:\n%v", w, err)
				}
			}
		})
	}
}

// A reload that switches a session's or a sender's protocol_version
// restarts it with the new version.
func TestProtocolVersionChangeRestartsOnReload(t *testing.T) {
	y := strings.Replace(pair, "  - {id: a-to-b, receiver: from-a, senders: [to-b], loop_peer: b-to-a}\n  - {id: b-to-a, receiver: from-b, senders: [to-a], loop_peer: a-to-b}\n",
		"  - {id: a-to-b, receiver: from-a, senders: [to-b]}\n  - {id: b-to-a, receiver: from-b, senders: [to-a]}\n", 1)
	old, err := Parse("old.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	y = strings.Replace(y, `{id: a, brokers`, `{id: a, protocol_version: 3.1.1, brokers`, 1)
	y = strings.Replace(y, `mqtt: {broker: "tcp://127.0.0.1:1884"}`, `mqtt: {broker: "tcp://127.0.0.1:1884", protocol_version: 3.1.1}`, 1)
	cur, err := Parse("new.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	d, ps := Compare(old, cur)
	if len(ps) > 0 {
		t.Fatal(ps)
	}
	if fmt.Sprint(d.Changed) != "[a]" || fmt.Sprint(d.Kept) != "[b]" || fmt.Sprint(d.SendersChanged) != "[to-b]" {
		t.Fatalf("diff %+v: want session a changed, b kept, sender to-b changed", d)
	}
}
