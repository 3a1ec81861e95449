package api

import (
	"net/url"
	"strings"
	"testing"
)

// The bridge filters of the agents list: bridge_id and role pass through,
// a role that no bridge reports is refused with the field, the value and
// the choices.
func TestParseFilterBridgeIDAndRole(t *testing.T) {
	f, err := ParseFilter(url.Values{"bridge_id": {"plant-1"}, "role": {"standby"}, "kind": {"bridge"}, "limit": {"5"}})
	if err != nil {
		t.Fatal(err)
	}
	if f.BridgeID != "plant-1" || f.Role != "standby" || f.Limit != 5 || f.Selector["service.name"] != BridgeServiceName {
		t.Fatalf("%+v", f)
	}
	_, err = ParseFilter(url.Values{"role": {"leader"}})
	if err == nil || !strings.Contains(err.Error(), `role: "leader": must be one of owner, standby, active, stopped`) {
		t.Fatalf("role=leader: %v", err)
	}
}
