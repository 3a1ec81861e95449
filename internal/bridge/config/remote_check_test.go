package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// hostFiles names, in every place that takes one, a file or variable of
// the bridge's host: a session's password file and TLS files, a postgres
// lease store's DSN file, the opamp block's secret file and CA file.
func hostFiles(t *testing.T, dir string) string {
	t.Helper()
	return edit(t,
		"    client_id: plant-bridge\n",
		"    client_id: plant-bridge\n    username: u\n    password_file: "+filepath.Join(dir, "pw")+"\n"+
			"    tls: {ca_file: "+filepath.Join(dir, "ca.pem")+", cert_file: "+filepath.Join(dir, "c.pem")+", key_file: "+filepath.Join(dir, "k.pem")+"}\n",
		"lease: {type: sqlite, path: /tmp/lease.db}",
		"lease: {type: postgres, dsn_file: "+filepath.Join(dir, "dsn")+"}",
	) + "opamp:\n  server_url: wss://myriarchd:4320/v1/opamp\n  enrollment_secret_file: " + filepath.Join(dir, "secret") +
		"\n  tls: {ca_file: " + filepath.Join(dir, "opamp-ca.pem") + "}\n"
}

// CheckRemote (myriarchd's check) reads none of the bridge host's files;
// Check (the bridge's, when it applies the configuration) refuses each
// missing one, named.
func TestCheckRemoteLeavesTheBridgeHostsFilesToTheBridge(t *testing.T) {
	dir := t.TempDir()
	data := []byte(hostFiles(t, dir))
	if _, problems := CheckRemote("config", data); len(problems) > 0 {
		t.Fatalf("CheckRemote read the bridge host's files: %v", problems)
	}
	if err := ValidateRemote("config", string(data)); err != nil {
		t.Fatal(err)
	}
	_, problems := Check("bridge.yaml", data)
	for _, f := range []string{"pw", "ca.pem", "c.pem", "k.pem", "dsn", "secret", "opamp-ca.pem"} {
		want := filepath.Join(dir, f) + `": cannot be read`
		if !strings.Contains(problems.Error(), want) {
			t.Errorf("Check does not name the missing %s: %v", f, problems)
		}
	}
	// On the bridge's host, with the files there, Check accepts it.
	for _, f := range []string{"pw", "ca.pem", "c.pem", "k.pem", "dsn", "secret", "opamp-ca.pem"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, problems := Check("bridge.yaml", data); len(problems) > 0 {
		t.Fatalf("with the files present: %v", problems)
	}

	// A variable of the bridge's host, likewise.
	env := []byte(edit(t, "    client_id: plant-bridge\n", "    client_id: plant-bridge\n    username: u\n    password_env: MYRIARCH_NOPE_NOT_SET\n"))
	if _, problems := CheckRemote("config", env); len(problems) > 0 {
		t.Fatalf("CheckRemote looked up the bridge host's variable: %v", problems)
	}
	if _, problems := Check("bridge.yaml", env); !strings.Contains(problems.Error(), `"MYRIARCH_NOPE_NOT_SET": names an environment variable that is not set`) {
		t.Fatalf("Check: %v", problems)
	}
}

// Everything that does not need the host still applies remotely: keys,
// single values, the rules relating keys, admission.
func TestCheckRemoteRunsEveryOtherRule(t *testing.T) {
	for _, c := range []struct {
		name  string
		pairs []string
		want  string
	}{
		{"unknown key", []string{"    client_id: plant-bridge\n", "    client_id: plant-bridge\n    pasword_file: pw\n"}, "sessions[0].pasword_file: unknown key"},
		{"file and variable", []string{"    client_id: plant-bridge\n", "    client_id: plant-bridge\n    username: u\n    password_file: pw\n    password_env: PW\n"},
			"set either sessions[0].password_file or sessions[0].password_env, not both"},
		{"half a key pair", []string{"    client_id: plant-bridge\n", "    client_id: plant-bridge\n    tls: {cert_file: c.pem}\n"}, "cert_file and key_file must be set together"},
		{"single value", []string{"lease_ttl: 10s", "lease_ttl: 1s"}, "routes[0].lease_ttl"},
		{"admission", []string{"failover_slo: 120s", "failover_slo: 30s"}, "routes[0].failover_slo: 30s: the owner-death budget is"},
	} {
		_, problems := CheckRemote("edge.yaml", []byte(edit(t, c.pairs...)))
		if !strings.Contains(problems.Error(), c.want) || !strings.HasPrefix(problems.Error(), "edge.yaml:") {
			t.Errorf("%s: %v, want %q naming edge.yaml", c.name, problems, c.want)
		}
	}
}
