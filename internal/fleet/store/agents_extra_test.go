package store

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestCapabilityNames(t *testing.T) {
	// ReportsStatus | AcceptsRemoteConfig | AcceptsRestartCommand | ReportsHealth, and an undefined bit.
	got := CapabilityNames(0x1 | 0x2 | 0x400 | 0x800 | 1<<40)
	want := []string{"ReportsStatus", "AcceptsRemoteConfig", "AcceptsRestartCommand", "ReportsHealth", "0x10000000000"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if n := CapabilityNames(0); n == nil || len(n) != 0 {
		t.Fatalf("no capabilities: %#v (want an empty list, shown as [])", n)
	}
	b, err := json.Marshal(Agent{InstanceUID: "u", Capabilities: 0x1})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"capability_names":["ReportsStatus"]`) || !strings.Contains(string(b), `"capabilities":1`) ||
		!strings.Contains(string(b), `"instance_uid":"u"`) {
		t.Fatalf("agent JSON: %s", b)
	}
}
