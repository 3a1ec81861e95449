package api

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzConfigRequest: any body either decodes to the config it carries or
// is refused with an error that names the body's rule; never a panic.
// Run: go test -fuzz FuzzConfigRequest -fuzztime 30s ./internal/fleet/api/
func FuzzConfigRequest(f *testing.F) {
	for _, s := range []string{`{"config": "a: 1\n"}`, `{"config": ""}`, `{}`, `{"config": 1}`, `{"config": "x", "y": 2}`,
		`{"config": "x"} {"config": "y"}`, `[]`, `null`, `{"config": "\u0000\ud800"}`, ``, `{"config": "` + strings.Repeat("a", 1000) + `"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := parseConfigRequest(body)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "body: ") {
				t.Fatalf("error does not name the body: %v", err)
			}
			return
		}
		// What was accepted survives a round trip.
		b, _ := json.Marshal(req)
		again, err := parseConfigRequest(b)
		if err != nil || (utf8.ValidString(req.Config) && again.Config != req.Config) {
			t.Fatalf("round trip: %q → %q (%v)", req.Config, again.Config, err)
		}
	})
}

// FuzzParseFilter: the list filters of GET /api/v1/agents from any query.
func FuzzParseFilter(f *testing.F) {
	for _, s := range []string{"status=online&limit=10", "selector=env%3Dprod,service.name%3Db", "limit=-1", "selector==", "after=%00", "status=up"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		v, err := url.ParseQuery(q)
		if err != nil {
			return
		}
		fl, err := ParseFilter(v)
		if err != nil {
			return
		}
		if fl.Limit < 0 || fl.Limit > 1000 || (fl.Status != "" && fl.Status != "online" && fl.Status != "offline") {
			t.Fatalf("accepted %+v from %q", fl, q)
		}
	})
}
