package main

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/myriarch/myriarch/internal/fleet/api"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// `myriarchd token bootstrap` writes the first admin token to the
// database; `token create|list|revoke` go through the API with it, and
// a running replica refuses a revoked token at once.
func TestTokenBootstrapCreateListAndRevoke(t *testing.T) {
	pg := pgtest.New(t)
	t.Setenv("MYRIARCH_DATABASE_URL", pg.DSN(""))
	run := func(args ...string) (string, string, int) {
		var out, errb syncBuf
		code := commands.Dispatch(append([]string{"token"}, args...), &out, &errb)
		return out.String(), errb.String(), code
	}
	out, errOut, code := run("bootstrap", "--name", "admin")
	if code != 0 || !strings.HasPrefix(out, "myr_") {
		t.Fatalf("bootstrap: %d %q %q", code, out, errOut)
	}
	adminTok := strings.TrimSpace(out)
	if _, errOut, code = run("bootstrap", "--name", "again"); code != 1 || !strings.Contains(errOut, "an active admin token exists") {
		t.Fatalf("second bootstrap: %d %q", code, errOut)
	}

	d := inProcessReplica(t, pg.DSN(""), "replica-t", nil)
	base := "http://" + d.HTTPAddr().String()
	t.Setenv("MYRIARCH_SERVER", base)
	t.Setenv("MYRIARCH_TOKEN", adminTok)
	idRe := regexp.MustCompile(`Token id (\d+) \(ci, role operator\)`)
	out, errOut, code = run("create", "--name", "ci", "--role", "operator")
	m := idRe.FindStringSubmatch(errOut)
	if code != 0 || m == nil || !strings.HasPrefix(out, "myr_") {
		t.Fatalf("create: %d %q %q", code, out, errOut)
	}
	ciTok := strings.TrimSpace(out)
	ciID, _ := strconv.ParseInt(m[1], 10, 64)
	if get(t, base+"/api/v1/agents", ciTok) != 200 {
		t.Fatal("the created token does not work")
	}
	// An operator token may not create tokens: the API's roles apply.
	if _, errOut, code = run("create", "--name", "x", "--role", "admin", "--token", ciTok); code != 1 || !strings.Contains(errOut, "needs role admin") || !strings.Contains(errOut, "HTTP 403") {
		t.Fatalf("create with an operator token: %d %q", code, errOut)
	}

	out, errOut, code = run("list")
	if code != 0 || !regexp.MustCompile(`(?m)^ID\s+NAME\s+ROLE\s+CREATED\s+LAST USED\s+STATUS$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^`+strconv.FormatInt(ciID, 10)+`\s+ci\s+operator\s+\S+\s+\S+\s+active$`).MatchString(out) {
		t.Fatalf("list: %d %q %q", code, out, errOut)
	}
	if strings.Contains(out, ciTok) || strings.Contains(out, adminTok) {
		t.Fatal("list shows a token")
	}
	out, errOut, code = run("revoke", strconv.FormatInt(ciID, 10))
	if code != 0 || !strings.Contains(out, "revoked token "+strconv.FormatInt(ciID, 10)+" (ci)") {
		t.Fatalf("revoke: %d %q %q", code, out, errOut)
	}
	if c := get(t, base+"/api/v1/agents", ciTok); c != 401 {
		t.Fatalf("revoked token still accepted: %d", c)
	}
	if out, _, code = run("revoke", strconv.FormatInt(ciID, 10)); code != 0 || !strings.Contains(out, "already revoked") {
		t.Fatalf("second revoke: %d %q", code, out)
	}
	out, _, code = run("list", "--status", "revoked", "-o", "json")
	var list api.TokenList
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list.Tokens) != 1 ||
		list.Tokens[0].ID != ciID || list.Tokens[0].RevokedAt == nil || !strings.HasPrefix(list.Tokens[0].RevokedBy, "token admin") {
		t.Fatalf("list revoked: %d %q %v", code, out, err)
	}
	if out, _, code = run("list", "--status", "active", "-o", "yaml"); code != 0 || !strings.Contains(out, "name: admin") || strings.Contains(out, "name: ci") {
		t.Fatalf("list active as YAML: %d %q", code, out)
	}

	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"revoke", strconv.FormatInt(ciID+100, 10)}, 1, "no token"},
		{[]string{"revoke", "x"}, 2, `id "x"`},
		{[]string{"revoke"}, 2, "takes ID"},
		{[]string{"list", "--status", "old"}, 2, "status: must be active or revoked (HTTP 400)"},
		{[]string{"list", "extra"}, 2, "takes no arguments"},
		{[]string{"create", "--name", "n"}, 2, `--role: role "": must be one of viewer, operator, admin`},
		{[]string{"list", "-o", "xml"}, 2, `--output "xml"`},
		{[]string{"frob"}, 2, "Usage"},
	} {
		_, errOut, code := run(c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("token %v: exit %d %q; want %d and %q", c.args, code, errOut, c.code, c.want)
		}
	}
}
