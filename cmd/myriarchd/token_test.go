package main

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// `myriarchd token create|list|revoke` against a real PostgreSQL, with a
// running replica that refuses a revoked token at once.
func TestTokenListAndRevoke(t *testing.T) {
	pg := pgtest.New(t)
	t.Setenv("MYRIARCH_DATABASE_URL", pg.DSN(""))
	run := func(args ...string) (string, string, int) {
		var out, errb syncBuf
		code := commands.Dispatch(append([]string{"token"}, args...), &out, &errb)
		return out.String(), errb.String(), code
	}
	idRe := regexp.MustCompile(`Token id (\d+) \(`)
	create := func(name string) (string, int64) {
		out, errOut, code := run("create", "--name", name)
		m := idRe.FindStringSubmatch(errOut)
		if code != 0 || m == nil {
			t.Fatalf("create %s: %d %q %q", name, code, out, errOut)
		}
		id, _ := strconv.ParseInt(m[1], 10, 64)
		return strings.TrimSpace(out), id
	}
	adminTok, _ := create("admin")
	ciTok, ciID := create("ci")

	d := inProcessReplica(t, pg.DSN(""), "replica-t", nil)
	base := "http://" + d.HTTPAddr().String()
	if get(t, base+"/api/v1/agents", ciTok) != 200 || get(t, base+"/api/v1/agents", adminTok) != 200 {
		t.Fatal("created tokens do not work")
	}

	out, errOut, code := run("list")
	if code != 0 || !regexp.MustCompile(`(?m)^ID\s+NAME\s+ROLE\s+CREATED\s+LAST USED\s+STATUS$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^`+strconv.FormatInt(ciID, 10)+`\s+ci\s+admin\s+\S+\s+\S+\s+active$`).MatchString(out) {
		t.Fatalf("list: %d %q %q", code, out, errOut)
	}
	if strings.Contains(out, ciTok) || strings.Contains(out, adminTok) {
		t.Fatal("list shows a token")
	}

	out, errOut, code = run("revoke", strconv.FormatInt(ciID, 10), "--config", "")
	if code != 0 || !strings.Contains(out, "revoked token "+strconv.FormatInt(ciID, 10)+" (ci)") {
		t.Fatalf("revoke: %d %q %q", code, out, errOut)
	}
	// Refused by the running replica with the next request.
	if c := get(t, base+"/api/v1/agents", ciTok); c != 401 {
		t.Fatalf("revoked token still accepted: %d", c)
	}
	if get(t, base+"/api/v1/agents", adminTok) != 200 {
		t.Fatal("the other token stopped working")
	}
	if out, _, code = run("revoke", strconv.FormatInt(ciID, 10)); code != 0 || !strings.Contains(out, "already revoked") {
		t.Fatalf("second revoke: %d %q", code, out)
	}
	out, _, code = run("list", "--status", "revoked", "--json")
	var list struct{ Tokens []store.Token }
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list.Tokens) != 1 ||
		list.Tokens[0].ID != ciID || list.Tokens[0].RevokedAt == nil || !strings.HasPrefix(list.Tokens[0].RevokedBy, "command line") {
		t.Fatalf("list revoked: %d %q %v", code, out, err)
	}
	if out, _, code = run("list", "--status", "active"); code != 0 || !strings.Contains(out, " admin ") || strings.Contains(out, " ci ") {
		t.Fatalf("list active: %d %q", code, out)
	}

	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"revoke", strconv.FormatInt(ciID+100, 10)}, 1, "no token with id"},
		{[]string{"revoke", "x"}, 2, `id "x"`},
		{[]string{"revoke"}, 2, "exactly one token id"},
		{[]string{"list", "--status", "old"}, 2, "--status"},
		{[]string{"list", "extra"}, 2, "unexpected"},
		{[]string{"frob"}, 2, "Usage"},
	} {
		_, errOut, code := run(c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("token %v: exit %d %q; want %d and %q", c.args, code, errOut, c.code, c.want)
		}
	}
}
