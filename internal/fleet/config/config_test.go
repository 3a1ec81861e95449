package config

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var base = []string{"MYRIARCH_DATABASE_URL=postgres://x@localhost/db", "MYRIARCH_SERVER_ENROLLMENTSECRET=0123456789abcdef"}

func TestDefaultsMatchTheSpec(t *testing.T) {
	c, err := Load(Source{Environ: base})
	if err != nil {
		t.Fatal(err)
	}
	if c.HA.LeaderSessionTimeout != 30*time.Second || c.HA.HeartbeatInterval != 10*time.Second ||
		c.HA.LeaderLockKey != 7012024 || c.Server.ShutdownTimeout != 30*time.Second {
		t.Fatalf("spec defaults: %+v %+v", c.HA, c.Server)
	}
	if c.Server.OpAMPListen != ":4320" || c.Server.OpAMPPath != "/v1/opamp" {
		t.Fatalf("opamp defaults: %+v", c.Server)
	}
	if c.HA.ReplicaID == "" {
		t.Fatal("replica id not defaulted")
	}
}

func TestEveryKeyHasAnEnvironmentVariable(t *testing.T) {
	if got := EnvName("ha.leaderSessionTimeout"); got != "MYRIARCH_HA_LEADERSESSIONTIMEOUT" {
		t.Fatal(got)
	}
	for _, s := range Settings {
		if s.Default == "" {
			continue
		}
		// Setting each key's default through its variable must be accepted.
		if _, err := Load(Source{Environ: append(base[:2:2], s.Env()+"="+s.Default)}); err != nil {
			t.Errorf("%s=%s: %v", s.Env(), s.Default, err)
		}
	}
}

func TestFileThenEnvironmentThenOverrides(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "c.yaml")
	os.WriteFile(f, []byte("ha:\n  leaderSessionTimeout: 20s\n  heartbeatInterval: 5s\nserver:\n  shutdownTimeout: 45s\n"), 0o600)
	c, err := Load(Source{File: f, Environ: append(base[:2:2], "MYRIARCH_HA_LEADERSESSIONTIMEOUT=40s"),
		Overrides: map[string]string{"ha.heartbeatInterval": "7s"}})
	if err != nil {
		t.Fatal(err)
	}
	if c.HA.LeaderSessionTimeout != 40*time.Second || c.HA.HeartbeatInterval != 7*time.Second || c.Server.ShutdownTimeout != 45*time.Second {
		t.Fatalf("%+v %+v", c.HA, c.Server)
	}
}

func TestInvalidValuesAreRefusedWithKeyValueAndRule(t *testing.T) {
	cases := []struct{ env, want string }{
		{"MYRIARCH_HA_LEADERSESSIONTIMEOUT=9s", `ha.leaderSessionTimeout: "9s" (from MYRIARCH_HA_LEADERSESSIONTIMEOUT): must be a duration within [10s, 10m]`},
		{"MYRIARCH_HA_LEADERSESSIONTIMEOUT=11m", "within [10s, 10m]"},
		{"MYRIARCH_HA_LEADERSESSIONTIMEOUT=abc", "must be a Go duration"},
		{"MYRIARCH_HA_LEADERLOCKKEY=x", "ha.leaderLockKey"},
		{"MYRIARCH_SERVER_SHUTDOWNTIMEOUT=0s", "server.shutdownTimeout"},
		{"MYRIARCH_SERVER_OPAMPLISTEN=nohost", "must be host:port"},
		{"MYRIARCH_LOG_LEVEL=loud", "must be one of"},
		{"MYRIARCH_AGENTS_OFFLINEAFTER=10s", "2 × server.lastSeenFlushInterval"},
	}
	for _, tc := range cases {
		_, err := Load(Source{Environ: append(base[:2:2], tc.env)})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.env, err, tc.want)
		}
	}
}

func TestAllProblemsAreReportedTogether(t *testing.T) {
	_, err := Load(Source{Environ: []string{"MYRIARCH_HA_HEARTBEATINTERVAL=0s"}, YAML: []byte("ha:\n  nonsense: 1\n")})
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"database.url", "server.enrollmentSecret", "ha.heartbeatInterval", "ha.nonsense: (not shown): unknown key"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in %v", want, err)
		}
	}
}

func TestOptionalWaivesRequired(t *testing.T) {
	if _, err := Load(Source{Environ: []string{}, Optional: []string{"database.url", "server.enrollmentSecret"}}); err != nil {
		t.Fatal(err)
	}
}

func TestBadYAMLShape(t *testing.T) {
	if _, err := Load(Source{Environ: base, YAML: []byte("- a\n")}); err == nil {
		t.Fatal("accepted a list")
	}
	if _, err := Load(Source{Environ: base, YAML: []byte("ha:\n  heartbeatInterval: [1]\n")}); err == nil {
		t.Fatal("accepted a list value")
	}
}

func TestSecretsAreNotEchoedInErrors(t *testing.T) {
	const sec = "short-secret"
	const dbURL = "postgres://admin:hunter2-password@db.internal:5432/fleet?sslmode=disable"
	_, err := Load(Source{Environ: []string{"MYRIARCH_SERVER_ENROLLMENTSECRET=" + sec, "MYRIARCH_DATABASE_URL=" + dbURL,
		"MYRIARCH_HA_LEADERSESSIONTIMEOUT=1s"}, YAML: []byte("server:\n  enrolmentSecret: typo-hunter2-secret\n")})
	if err == nil {
		t.Fatal("want errors")
	}
	msg := err.Error()
	for _, leak := range []string{sec, "hunter2"} {
		if strings.Contains(msg, leak) {
			t.Errorf("error echoes a secret %q:\n%s", leak, msg)
		}
	}
	if !strings.Contains(msg, "server.enrollmentSecret: (redacted, 12 characters)") || !strings.Contains(msg, "server.enrolmentSecret") {
		t.Errorf("error must still name the field and the rule:\n%s", msg)
	}
	// A bad database URL is named, not shown.
	_, err = Load(Source{Environ: []string{"MYRIARCH_SERVER_ENROLLMENTSECRET=0123456789abcdef", "MYRIARCH_DATABASE_URL=mysql://root:hunter2@x/db"}})
	if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "database.url") {
		t.Fatalf("database.url error: %v", err)
	}
}

func TestHTTPTLSFilesGoTogether(t *testing.T) {
	_, err := Load(Source{Environ: append(base[:2:2], "MYRIARCH_SERVER_HTTPTLSCERTFILE=/x.pem")})
	if err == nil || !strings.Contains(err.Error(), "server.httpTlsKeyFile") {
		t.Fatal(err)
	}
}

func TestArtifactS3SettingsAreChecked(t *testing.T) {
	base := map[string]string{"database.url": "postgres://x", "server.enrollmentSecret": "0123456789abcdef0123"}
	load := func(kv ...string) error {
		o := maps.Clone(base)
		for i := 0; i+1 < len(kv); i += 2 {
			o[kv[i]] = kv[i+1]
		}
		_, err := Load(Source{Environ: []string{}, Overrides: o})
		return err
	}
	if err := load(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	err := load("artifacts.store", "s3")
	for _, want := range []string{"artifacts.s3Endpoint", "artifacts.s3Bucket", "artifacts.s3AccessKey", "artifacts.s3SecretKey", "is required with artifacts.store s3"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("want %q in %v", want, err)
		}
	}
	for _, c := range []struct{ key, value, rule string }{
		{"artifacts.store", "disk", "must be postgres or s3"},
		{"artifacts.s3Endpoint", "https://s3.example.com", "must be host:port"},
		{"artifacts.s3Bucket", "Bad_Bucket", "must be an S3 bucket name"},
		{"artifacts.s3Tls", "yes please", "must be true or false"},
		{"artifacts.segmentBytes", "1024", "must be an integer within"},
	} {
		err := load(c.key, c.value)
		if err == nil || !strings.Contains(err.Error(), c.key) || !strings.Contains(err.Error(), c.value) || !strings.Contains(err.Error(), c.rule) {
			t.Errorf("%s=%s: %v", c.key, c.value, err)
		}
	}
	// The secret is never echoed.
	err = load("artifacts.s3SecretKey", "hunter2-the-secret", "artifacts.s3SecretKeyFile", "/k")
	if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "not both") {
		t.Fatalf("both secrets: %v", err)
	}
	if err := load("artifacts.store", "s3", "artifacts.s3Endpoint", "s3.example.com:443", "artifacts.s3Bucket", "fleet-artifacts",
		"artifacts.s3AccessKey", "AK", "artifacts.s3SecretKey", "SK"); err != nil {
		t.Fatalf("complete S3 settings: %v", err)
	}
}

// A misspelt variable used to be skipped without a word, leaving its key at
// the default: MYRIARCH_SERVER_MAXREQUESTBYTE=-1 passed the check.
func TestUnknownEnvironmentVariableIsRefusedNamingTheNearest(t *testing.T) {
	_, err := Load(Source{Environ: append(base[:2:2], "MYRIARCH_SERVER_MAXREQUESTBYTE=-1")})
	if err == nil {
		t.Fatal("a misspelt MYRIARCH_SERVER_MAXREQUESTBYTE was accepted")
	}
	want := "MYRIARCH_SERVER_MAXREQUESTBYTE: (not shown): unknown environment variable (no setting has it); " +
		"the nearest known one is MYRIARCH_SERVER_MAXREQUESTBYTES (key server.maxRequestBytes)"
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v\nwant %q", err, want)
	}
	if strings.Contains(err.Error(), "-1") {
		t.Fatalf("the value is echoed: %v", err)
	}
	// Every one is reported, and the commands' own variables are accepted.
	_, err = Load(Source{Environ: append(base[:2:2], "MYRIARCH_HA_LEADERSESIONTIMEOUT=5s", "MYRIARCH_LOG_LEVL=debug",
		"MYRIARCH_CONFIG=/etc/myriarchd.yaml", "MYRIARCH_TOKEN=myr_x", "MYRIARCH_SERVER=http://x", "OTHER_VAR=1")})
	if err == nil {
		t.Fatal("two misspelt variables were accepted")
	}
	for _, want := range []string{"nearest known one is MYRIARCH_HA_LEADERSESSIONTIMEOUT", "nearest known one is MYRIARCH_LOG_LEVEL"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in %v", want, err)
		}
	}
	for _, ok := range []string{"MYRIARCH_CONFIG", "MYRIARCH_TOKEN", "MYRIARCH_SERVER:", "OTHER_VAR"} {
		if strings.Contains(err.Error(), ok) {
			t.Errorf("%s refused: %v", ok, err)
		}
	}
	if _, err := Load(Source{Environ: append(base[:2:2], "MYRIARCH_CONFIG=/x", "MYRIARCH_TOKEN=y", "MYRIARCH_SERVER=z")}); err != nil {
		t.Fatal(err)
	}
	// A section's prefix is enough to be refused, however far the rest is.
	if _, err := Load(Source{Environ: append(base[:2:2], "MYRIARCH_DATABASE_CONNECTIONPOOLSIZE=4")}); err == nil {
		t.Fatal("MYRIARCH_DATABASE_CONNECTIONPOOLSIZE was accepted")
	}
	// What other programs on the host read (the bridge's password_env of
	// examples/clustered-postgres.yaml, the benchmarks' knobs) is not
	// myriarchd's: a shell that runs both daemons must still start it.
	if _, err := Load(Source{Environ: append(base[:2:2], "MYRIARCH_SOURCE_PASSWORD=pw", "MYRIARCH_BENCH_ROUTES=4", "MYRIARCH_MEASURE=1")}); err != nil {
		t.Fatalf("variables of other programs refused: %v", err)
	}
}
