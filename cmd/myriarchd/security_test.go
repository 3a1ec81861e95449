package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// `token create --role` and `agent revoke|rotate-credential`.
func TestTokenRolesAndAgentRevocation(t *testing.T) {
	pg := pgtest.New(t)
	d := inProcessReplica(t, pg.DSN(""), "replica-s", nil)
	ctx := context.Background()
	first, err := d.Store.CreateToken(ctx, "first")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MYRIARCH_SERVER", "http://"+d.HTTPAddr().String())
	t.Setenv("MYRIARCH_TOKEN", first)
	dispatch := func(args ...string) (string, string, int) {
		var out, errb syncBuf
		code := commands.Dispatch(args, &out, &errb)
		return out.String(), errb.String(), code
	}
	if _, errOut, code := dispatch("token", "create", "--name", "x", "--role", "root"); code == 0 || !strings.Contains(errOut, `role "root": must be one of viewer, operator, admin`) {
		t.Fatalf("bad role: %d %q", code, errOut)
	}
	viewer, errOut, code := dispatch("token", "create", "--name", "v", "--role", "viewer")
	if code != 0 || !regexp.MustCompile(`\(v, role viewer\)`).MatchString(errOut) {
		t.Fatalf("create viewer: %d %q", code, errOut)
	}
	viewer = strings.TrimSpace(viewer)
	admin, _, _ := dispatch("token", "create", "--name", "a", "--role", "admin")
	admin = strings.TrimSpace(admin)
	base := "http://" + d.HTTPAddr().String()
	if c := get(t, base+"/api/v1/agents", viewer); c != 200 {
		t.Fatalf("viewer reads: %d", c)
	}
	if c := get(t, base+"/api/v1/tokens", viewer); c != 403 {
		t.Fatalf("viewer lists tokens: %d", c)
	}
	// Text PostgreSQL cannot store is a 400 naming the parameter, not a
	// 500 with a SQLSTATE; the token's name is bounded and one line.
	for _, u := range []string{"/api/v1/agents?bridge_id=%00", "/api/v1/agents?after=%ff", "/api/v1/agents/a%00b"} {
		if c := get(t, base+u, viewer); c != 400 {
			t.Errorf("GET %s: %d, want 400", u, c)
		}
	}
	if _, errOut, code := dispatch("token", "create", "--name", "ci\nINFO forged", "--role", "viewer"); code != 2 || !strings.Contains(errOut, "must not contain control characters") {
		t.Errorf("token name with a line break: %d %q", code, errOut)
	}
	if _, errOut, code := dispatch("token", "create", "--name", strings.Repeat("a", 5000), "--role", "viewer"); code != 2 || !strings.Contains(errOut, "at most 100 characters") {
		t.Errorf("token name of 5000 characters: %d %q", code, errOut)
	}

	ag, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + d.OpAMPAddr().String() + "/v1/opamp", Secret: testSecret, Credential: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Stop(ctx)
	if !fleettest.Eventually(30*time.Second, func() bool { return ag.Credential() != "" }) {
		t.Fatal("no credential")
	}
	firstCred := ag.Credential()
	flags := []string{"--server", base}
	if _, errOut, code := dispatch(append([]string{"agent", "rotate-credential", ag.UIDString(), "--token", viewer}, flags...)...); code == 0 || !strings.Contains(errOut, "needs role admin") {
		t.Fatalf("viewer rotates: %d %q", code, errOut)
	}
	if _, errOut, code := dispatch(append([]string{"agent", "rotate-credential", ag.UIDString(), "--token", admin}, flags...)...); code != 0 {
		t.Fatalf("rotate: %d %q", code, errOut)
	}
	if !fleettest.Eventually(30*time.Second, func() bool { return ag.Credential() != firstCred }) {
		t.Fatal("rotated credential never arrived")
	}
	if _, errOut, code := dispatch(append([]string{"agent", "revoke", ag.UIDString(), "--token", admin}, flags...)...); code != 0 {
		t.Fatalf("revoke: %d %q", code, errOut)
	}
	if !fleettest.Eventually(30*time.Second, func() bool { return d.OpAMP.Connections() == 0 && ag.ConnectFailures() > 0 }) {
		t.Fatal("the revoked agent stayed connected or reconnected")
	}
}
