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
