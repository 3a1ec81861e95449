package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// bridgeGood is a bridge configuration that the bridge's check admits.
const bridgeGood = `bridge:
  id: plant-bridge
  instance_id: a
  deployment_mode: standalone
  http: {listen: "127.0.0.1:0"}
stores:
  lease: {type: sqlite, path: /tmp/lease.db}
sessions:
  - id: plant
    session_mode: exclusive
    brokers: ["tcp://127.0.0.1:1883"]
    client_id: plant-bridge
    connect_timeout: 2s
    reconcile_timeout: 2s
    unmatched_grace: 1s
receivers:
  - id: telemetry
    session: plant
    topics:
      - {filter: "plant/+/telemetry", qos: 1}
senders:
  - id: archive
    type: file
    file: {path: /tmp/archive.jsonl}
routes:
  - id: telemetry-archive
    receiver: telemetry
    senders: [archive]
    lease_ttl: 10s
    step_down_grace: 3s
    failover_slo: 120s
    broker_health_step_down: 20s
`

// withBridgeHostFiles is bridgeGood naming a password file, a CA file and
// an environment variable that exist on no host here: they are the bridge
// host's.
var withBridgeHostFiles = strings.Replace(bridgeGood, "    client_id: plant-bridge\n",
	"    client_id: plant-bridge\n    username: plant\n    password_file: /nonexistent/pw\n    tls: {ca_file: /nonexistent/ca.pem}\n", 1)

// refusedByAdmission is bridgeGood with an objective that its budget
// cannot meet.
var refusedByAdmission = strings.Replace(bridgeGood, "failover_slo: 120s", "failover_slo: 30s", 1)

// cmd/myriarchd registers the bridge's check for the myriarch-bridge type
// (validators.go): the bridge's rules apply, and the files and variables
// that the configuration names are left to the bridge's host.
func TestBridgeValidatorIsRegistered(t *testing.T) {
	if err := configs.Validate(configs.TypeBridge, bridgeGood); err != nil {
		t.Fatalf("good bridge configuration refused: %v", err)
	}
	if err := configs.Validate(configs.TypeBridge, withBridgeHostFiles); err != nil {
		t.Fatalf("a configuration naming files on the bridge's host was refused: %v", err)
	}
	envOnly := strings.Replace(withBridgeHostFiles, "password_file: /nonexistent/pw", "password_env: MYRIARCH_NOPE_NOT_SET", 1)
	if err := configs.Validate(configs.TypeBridge, envOnly); err != nil {
		t.Fatalf("a configuration naming a variable on the bridge's host was refused: %v", err)
	}
	for _, c := range []struct{ content, want string }{
		{strings.Replace(bridgeGood, "step_down_grace: 3s", "step_down_grace: 30s", 1), "content (type myriarch-bridge): refused by the bridge's check: config:"},
		{bridgeGood + "unknown_section: 1\n", "config:33: unknown_section: unknown key"},
		{refusedByAdmission, "routes[0].failover_slo: 30s: the owner-death budget is"},
		// Rules of the secret keys that need no file still apply.
		{strings.Replace(withBridgeHostFiles, "password_file: /nonexistent/pw", "password_file: /nonexistent/pw\n    password_env: PW", 1), "set either sessions[0].password_file or sessions[0].password_env, not both"},
	} {
		err := configs.Validate(configs.TypeBridge, c.content)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want %q", err, c.want)
		}
	}
}

// Against a replica: the REST API stores a bridge configuration that names
// files on the bridge's host (PUT .../agents/{uid}/config and a revision
// of a myriarch-bridge configuration); a revision refused by admission
// gets 422 with the same problem from both endpoints; and `myriarchd config
// revise --file` names the file in the problem, not "config".
func TestBridgeConfigurationsOverTheAPIAndTheCommand(t *testing.T) {
	pg := pgtest.New(t)
	t.Setenv("MYRIARCH_DATABASE_URL", pg.DSN(""))
	d := inProcessReplica(t, pg.DSN(""), "replica-v", nil)
	ctx := t.Context()
	tok, err := d.Store.CreateToken(ctx, "validators")
	if err != nil {
		t.Fatal(err)
	}
	ag, err := fleettest.StartAgent(ctx, fleettest.AgentOptions{URL: "ws://" + d.OpAMPAddr().String() + "/v1/opamp", Secret: testSecret,
		Attrs: map[string]string{"service.name": "myriarch-bridge", "role": "plant"}})
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Stop(ctx)
	if !fleettest.Eventually(time.Minute, func() bool {
		a, err := d.Store.GetAgent(ctx, ag.UIDString())
		return err == nil && a.Identifying["service.name"] == "myriarch-bridge"
	}) {
		t.Fatal("bridge agent not registered")
	}
	call := func(method, path string, body any) (int, string) {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(method, "http://"+d.HTTPAddr().String()+path, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}

	// Files on the bridge's host: stored, by both endpoints.
	if c, b := call("PUT", "/api/v1/agents/"+ag.UIDString()+"/config", map[string]string{"config": withBridgeHostFiles}); c != http.StatusAccepted {
		t.Fatalf("PUT agent config naming the bridge host's files: %d %s", c, b)
	}
	if c, b := call("PUT", "/api/v1/configs/plant", map[string]any{"type": configs.TypeBridge, "selector": "role=plant"}); c != http.StatusCreated {
		t.Fatalf("create configuration: %d %s", c, b)
	}
	if c, b := call("POST", "/api/v1/configs/plant/revisions", map[string]string{"content": withBridgeHostFiles}); c != http.StatusCreated {
		t.Fatalf("revision naming the bridge host's files: %d %s", c, b)
	}

	// Refused by admission: one status, the same problem, on both.
	c1, b1 := call("PUT", "/api/v1/agents/"+ag.UIDString()+"/config", map[string]string{"config": refusedByAdmission})
	c2, b2 := call("POST", "/api/v1/configs/plant/revisions", map[string]string{"content": refusedByAdmission})
	const problem = "config:31: routes[0].failover_slo: 30s: the owner-death budget is"
	if c1 != http.StatusUnprocessableEntity || c2 != http.StatusUnprocessableEntity || !strings.Contains(b1, problem) || !strings.Contains(b2, problem) {
		t.Fatalf("admission refusal: agent config %d %s; revision %d %s; want 422 with %q from both", c1, b1, c2, b2, problem)
	}

	// The command names the file given with --file.
	file := filepath.Join(t.TempDir(), "plant-bridge.yaml")
	if err := os.WriteFile(file, []byte(refusedByAdmission), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MYRIARCH_SERVER", "http://"+d.HTTPAddr().String())
	t.Setenv("MYRIARCH_TOKEN", tok)
	var out, errb syncBuf
	code := commands.Dispatch([]string{"config", "revise", "plant", "--file", file}, &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), file+":31: routes[0].failover_slo: 30s") || strings.Contains(errb.String(), "config:31") {
		t.Fatalf("config revise --file: exit %d, %q %q; want exit 2 naming %s:31", code, out.String(), errb.String(), file)
	}
}
