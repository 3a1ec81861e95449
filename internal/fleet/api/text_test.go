package api

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// Text PostgreSQL cannot store (NUL, invalid UTF-8) is refused with the
// parameter named, before a query fails with a SQLSTATE (a 500).
func TestRequestTextIsRefusedByName(t *testing.T) {
	for _, c := range []struct{ target, want string }{
		{"/api/v1/agents?bridge_id=%00", `query parameter bridge_id "\x00": must not contain NUL`},
		{"/api/v1/agents?bridge_id=%ff", `query parameter bridge_id "\xff": must be valid UTF-8`},
		{"/api/v1/configs/edge/revisions/2/preview?selector=a%3D%00", `query parameter selector "a=\x00"`},
		{"/api/v1/agents/a%00b", `path "/api/v1/agents/a\x00b": must not contain NUL`},
		{"/api/v1/agents?%00=1", `query parameter "\x00": must not contain NUL`},
	} {
		err := CheckRequestText(httptest.NewRequest("GET", c.target, nil))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.target, err, c.want)
		}
	}
	if err := CheckRequestText(httptest.NewRequest("GET", "/api/v1/agents?bridge_id=plant-1&selector=a%3Db%27", nil)); err != nil {
		t.Errorf("ordinary parameters refused: %v", err)
	}
	for _, c := range []struct{ body, want string }{
		{`{"name": "x\u0000y", "role": "viewer"}`, `body: name "x\x00y": must not contain NUL`},
		{`{"config": "edge", "spec": {"waves": ["1", "\u0000"]}}`, `body: waves "\x00"`},
		{`{"spec": {"selector": "a=b"}, "config": "e\u0000"}`, `body: config "e\x00"`},
		{`{"a\u0000": 1}`, `body: key "a\x00"`},
	} {
		if err := checkJSONText([]byte(c.body)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.body, err, c.want)
		}
	}
	// PUT /api/v1/agents/{uid}/config (its own decoder) checks the same.
	if _, err := parseConfigRequest([]byte(`{"config": "a\u0000"}`)); err == nil || !strings.Contains(err.Error(), `body: config "a\x00": must not contain NUL`) {
		t.Errorf("agent config with NUL: %v", err)
	}
	for _, ok := range []string{`{"content": "a\\u0000 is six characters"}`, `{"name": "ci"}`, `not json \u0000`} {
		if err := checkJSONText([]byte(ok)); err != nil {
			t.Errorf("%s: refused: %v", ok, err)
		}
	}
}
