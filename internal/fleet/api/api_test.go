package api

import (
	"net/url"
	"strings"
	"testing"
)

func TestParseFilterNamesTheBadParameter(t *testing.T) {
	f, err := ParseFilter(url.Values{"status": {"online"}, "selector": {"env=prod, service.name=bridge"}, "limit": {"10"}, "after": {"x"}, "replica": {"r1"}})
	if err != nil {
		t.Fatal(err)
	}
	if f.Status != "online" || f.Limit != 10 || f.After != "x" || f.Replica != "r1" || f.Selector["env"] != "prod" || f.Selector["service.name"] != "bridge" {
		t.Fatalf("%+v", f)
	}
	for q, want := range map[string]string{"status=up": "status:", "limit=0": "limit:", "limit=1001": "limit:", "limit=x": "limit:", "selector=env": "selector"} {
		v, _ := url.ParseQuery(q)
		if _, err := ParseFilter(v); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", q, err)
		}
	}
}

// The located problems of a refused configuration, as the error body
// lists them: the bridge's problems (file:line: field: message, one a
// line, the first after a prefix) and a YAML syntax error's line.
func TestProblemsOfARefusal(t *testing.T) {
	got := problemsOf("content (type myriarch-bridge): refused by the bridge's check: config:31: routes[0].failover_slo: 30s: the owner-death budget is 41s\nconfig:40: unknown_section: unknown key\nconfig: no line here")
	want := []Problem{{File: "config", Line: 31, Field: "routes[0].failover_slo", Message: "30s: the owner-death budget is 41s"},
		{File: "config", Line: 40, Field: "unknown_section", Message: "unknown key"}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("%+v", got)
	}
	if got := problemsOf("content (type yaml): not well-formed YAML: line 2: did not find expected node content"); len(got) != 1 || got[0].Line != 2 || got[0].Message != "not well-formed YAML: did not find expected node content" {
		t.Fatalf("yaml: %+v", got)
	}
	if got := problemsOf(`type "json": must be one of myriarch-bridge, yaml`); got != nil {
		t.Fatalf("no location: %+v", got)
	}
}
