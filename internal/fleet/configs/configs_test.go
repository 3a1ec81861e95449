package configs

import (
	"strings"
	"testing"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

const bridgeGood = `
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
    lease_ttl: 10s
    step_down_grace: 3s
    failover_slo: 120s
    broker_health_step_down: 20s
`

func TestValidate(t *testing.T) {
	if err := Validate(TypeBridge, bridgeGood); err != nil {
		t.Fatalf("good bridge config refused: %v", err)
	}
	if err := Validate(TypeYAML, "a: 1\nb: [1, 2]\n"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ typ, content, want string }{
		{TypeYAML, "a: [1\n", "content (type yaml): not well-formed YAML"},
		{TypeYAML, "  \n", "content: must not be empty"},
		{TypeBridge, "a: [1\n", "not well-formed YAML"},
		// The bridge's own check: a step_down_grace not below the lease TTL.
		{TypeBridge, strings.Replace(bridgeGood, "step_down_grace: 3s", "step_down_grace: 30s", 1), "refused by the bridge's check"},
		{TypeBridge, bridgeGood + "unknown_section: 1\n", "refused by the bridge's check"},
		{"json", "{}", `type "json": must be one of myriarch-bridge, yaml`},
	} {
		err := Validate(c.typ, c.content)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %q: %v, want %q", c.typ, c.content, err, c.want)
		}
	}
}

func TestCheckDef(t *testing.T) {
	if err := CheckDef(store.ConfigDef{Name: "edge-eu.1", Type: TypeYAML}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		def  store.ConfigDef
		want string
	}{
		{store.ConfigDef{Name: "Edge", Type: TypeYAML}, `name "Edge": must be 1 to 64 characters`},
		{store.ConfigDef{Name: "-edge", Type: TypeYAML}, `name "-edge"`},
		{store.ConfigDef{Name: "edge", Type: "toml"}, `type "toml"`},
		{store.ConfigDef{Name: "edge", Type: TypeYAML, Priority: 2000000}, "priority 2000000: must be within"},
	} {
		err := CheckDef(c.def)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.def, err, c.want)
		}
	}
}

func TestDiff(t *testing.T) {
	if d := Diff("a", "b", "x\n", "x\n"); d != "" {
		t.Errorf("equal: %q", d)
	}
	a := "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n"
	b := "1\n2\nthree\n4\n5\n6\n7\n8\n9\n10\n11\n12\n13\n"
	want := `--- r1
+++ r2
@@ -1,6 +1,6 @@
 1
 2
-3
+three
 4
 5
 6
@@ -10,3 +10,4 @@
 10
 11
 12
+13
`
	if got := Diff("r1", "r2", a, b); got != want {
		t.Errorf("diff:\n%s\nwant:\n%s", got, want)
	}
	if got := Diff("r1", "r2", "", "new\n"); got != "--- r1\n+++ r2\n@@ -0,0 +1 @@\n+new\n" {
		t.Errorf("from empty: %q", got)
	}
}
