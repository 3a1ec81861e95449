package store

import (
	"encoding/json"
	"slices"
	"testing"
)

func TestBridgeSessionsAndRoles(t *testing.T) {
	health := json.RawMessage(`{"healthy":true,"components":{
		"session/b":{"healthy":true,"status":"mode=exclusive role=standby service_level=none"},
		"session/a":{"healthy":false,"status":"mode=exclusive role=owner lease_version=7","last_error":"broker down"},
		"route/x":{"healthy":true,"status":"role=ignored"}}}`)
	a := Agent{NonIdentifying: map[string]string{BridgeIDAttribute: "plant-1"}, Health: health}
	if got := a.BridgeID(); got != "plant-1" {
		t.Fatalf("BridgeID = %q, want plant-1", got)
	}
	ss := a.BridgeSessions()
	if len(ss) != 2 || ss[0].ID != "a" || ss[1].ID != "b" {
		t.Fatalf("sessions = %+v, want a then b (route/x is not a session)", ss)
	}
	if ss[0].Role != RoleOwner || ss[0].Healthy || ss[0].Error != "broker down" || ss[0].Fields["lease_version"] != "7" {
		t.Fatalf("session a = %+v", ss[0])
	}
	if got := a.Roles(); !slices.Equal(got, []string{RoleOwner, RoleStandby}) {
		t.Fatalf("Roles = %v", got)
	}
	if got := (Agent{Health: json.RawMessage(`not json`)}).Roles(); got != nil {
		t.Fatalf("Roles of an unreadable report = %v, want none", got)
	}
}
