package config

import (
	"strings"
	"testing"
)

// pair is a bidirectional bridge between brokers A and B: two ephemeral
// sessions, one route each way, named as each other's loop_peer.
const pair = `
bridge: {id: ab, instance_id: a, deployment_mode: standalone, http: {listen: "127.0.0.1:0"}}
stores:
  lease: {type: sqlite, path: /tmp/lease.db}
sessions:
  - {id: a, brokers: ["tcp://127.0.0.1:1883"]}
  - {id: b, brokers: ["tcp://127.0.0.1:1884"]}
receivers:
  - {id: from-a, session: a, topics: [{filter: "x/#"}]}
  - {id: from-b, session: b, topics: [{filter: "x/#"}]}
senders:
  - {id: to-a, type: mqtt, mqtt: {broker: "tcp://127.0.0.1:1883"}}
  - {id: to-b, type: mqtt, mqtt: {broker: "tcp://127.0.0.1:1884"}}
  - {id: archive, type: file, file: {path: /tmp/archive.jsonl}}
routes:
  - {id: a-to-b, receiver: from-a, senders: [to-b], loop_peer: b-to-a}
  - {id: b-to-a, receiver: from-b, senders: [to-a], loop_peer: a-to-b}
`

func TestLoopPeer(t *testing.T) {
	cfg, err := Parse("pair.yaml", []byte(pair))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Routes[0].LoopPeer != "b-to-a" || cfg.Routes[1].LoopPeer != "a-to-b" {
		t.Fatalf("loop peers not carried: %+v", cfg.Routes)
	}
}

func TestBadLoopPeer(t *testing.T) {
	cases := []struct {
		name     string
		old, new string
		want     string
	}{
		{"itself", "loop_peer: b-to-a}", "loop_peer: a-to-b}",
			`routes[0].loop_peer: "a-to-b": must name the route of the opposite direction, not the route itself`},
		{"unknown route", "loop_peer: b-to-a}", "loop_peer: b-to-c}", `routes[0].loop_peer: "b-to-c": names no route`},
		{"not named back", "senders: [to-a], loop_peer: a-to-b}", "senders: [to-a]}",
			`routes[0].loop_peer: "b-to-a": route "b-to-a" must name "a-to-b" as its loop_peer: a loop pair is two routes that name each other (it has "")`},
		{"non-mqtt sender", "senders: [to-b], loop_peer", "senders: [to-b, archive], loop_peer",
			`routes[0].senders[1]: "archive": is a file sender; a route with loop_peer needs mqtt senders`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(pair, c.old) {
				t.Fatalf("edit %q does not apply", c.old)
			}
			_, err := Parse("bad.yaml", []byte(strings.Replace(pair, c.old, c.new, 1)))
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("missing %q in:\n%s", c.want, err)
			}
		})
	}
}
