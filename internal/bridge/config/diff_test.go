package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func mustParse(t *testing.T, y string) *Config {
	t.Helper()
	cfg, err := Parse("good.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestCompare(t *testing.T) {
	old := mustParse(t, good)
	for _, tc := range []struct {
		name, from, to string
		kept, changed  string
		problem        string
	}{
		{"identical", "", "", "[plant]", "[]", ""},
		{"a route added on the same receiver keeps the session", "routes:\n", `routes:
  - {id: second, receiver: telemetry, senders: [archive], lease_ttl: 10s, step_down_grace: 3s, failover_slo: 120s, broker_health_step_down: 20s}
`, "[plant]", "[]", ""},
		{"a new cadence changes it", "lease_ttl: 10s", "lease_ttl: 12s", "[]", "[plant]", ""},
		{"a new filter changes it", `{filter: "plant/+/telemetry", qos: 1}`, `{filter: "plant/#", qos: 1}`, "[]", "[plant]", ""},
		{"a connection setting changes it", "connect_timeout: 2s", "connect_timeout: 3s", "[]", "[plant]", ""},
		{"the bridge id takes a restart", "id: plant-bridge\n  instance_id", "id: other\n  instance_id", "", "", `good.yaml: bridge.id: other: differs from the running configuration (plant-bridge); it takes a restart, not a reload`},
		{"the lease store takes a restart", "/tmp/lease.db", "/tmp/other.db", "", "", "stores.lease: differs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := mustParse(t, strings.Replace(good, tc.from, tc.to, 1))
			d, ps := Compare(old, cur)
			if tc.problem != "" {
				if !strings.Contains(ps.Error(), tc.problem) {
					t.Fatalf("problems %q, want %q", ps.Error(), tc.problem)
				}
				return
			}
			if len(ps) > 0 {
				t.Fatal(ps)
			}
			if got := sprintf("%v", d.Kept); got != tc.kept {
				t.Errorf("kept %s, want %s", got, tc.kept)
			}
			if got := sprintf("%v", d.Changed); got != tc.changed {
				t.Errorf("changed %s, want %s", got, tc.changed)
			}
		})
	}
}

func TestRedacted(t *testing.T) {
	in := `stores:
  lease: {type: postgres, dsn: "postgres://u:hunter2@db/x"}
sessions:
  - {id: s, brokers: ["mqtt://user:brokerpw@h:1883"], password_file: /etc/pw}
senders:
  - {id: h, type: http, http: {url: "http://x", headers: {Authorization: "Bearer tok123"}}}
`
	out, err := Redacted([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"hunter2", "brokerpw", "tok123"} {
		if strings.Contains(string(out), secret) {
			t.Errorf("%q left in:\n%s", secret, out)
		}
	}
	for _, keep := range []string{"/etc/pw", "user:redacted@h:1883", "Authorization: '[redacted]'"} {
		if !strings.Contains(string(out), keep) {
			t.Errorf("%q missing in:\n%s", keep, out)
		}
	}
}

func TestWithLocalOpAMP(t *testing.T) {
	local := []byte("bridge: {id: x}\nopamp:\n  server_url: ws://h:4320/v1/opamp\n")
	got, err := WithLocalOpAMP([]byte("bridge: {id: y}\n"), local)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(got), "server_url: ws://h:4320/v1/opamp") || !strings.Contains(string(got), "id: y") {
		t.Fatalf("merged:\n%s", got)
	}
	own := []byte("bridge: {id: y}\nopamp: {server_url: ws://other:1/v1/opamp}\n")
	if got, _ := WithLocalOpAMP(own, local); string(got) != string(own) {
		t.Fatalf("a remote opamp block was replaced:\n%s", got)
	}
}

func TestOpAMPBlock(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("s3cret-enrollment\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := mustParse(t, good+"opamp:\n  server_url: wss://myriarchd:4320/v1/opamp\n  enrollment_secret_file: "+secret+"\n")
	if cfg.OpAMP == nil || cfg.OpAMP.EnrollmentSecret.Reveal() != "s3cret-enrollment" || cfg.OpAMP.ServerURL != "wss://myriarchd:4320/v1/opamp" {
		t.Fatalf("opamp: %+v", cfg.OpAMP)
	}
	if mustParse(t, good).OpAMP != nil {
		t.Fatal("no opamp block must mean no OpAMP client")
	}
	_, err := Parse("bad.yaml", []byte(good+"opamp:\n  server_url: ftp://x/y\n  heartbeat_interval: 10ms\n"))
	for _, want := range []string{
		`opamp.server_url: "ftp://x/y": scheme must be ws, wss, http or https`,
		`opamp.enrollment_secret_file: is required`,
		`opamp.heartbeat_interval: "10ms": must be at least 1s`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
}

func TestWriteFileAtomic(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte("old"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(p, []byte("new")); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	fi, _ := os.Stat(p)
	if string(b) != "new" || fi.Mode().Perm() != 0o640 {
		t.Fatalf("%q %v", b, fi.Mode())
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(p), ".c.yaml.tmp-*"))
	if len(left) > 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}
