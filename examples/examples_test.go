// Package examples holds complete myriarch-bridge configurations; its test
// runs `myriarch-bridge check` on each, so that none of them rots.
package examples

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// buildBridge builds the real binary: the test checks the files the way an
// operator does.
func buildBridge(t *testing.T) string {
	t.Helper()
	build.Do(func() {
		dir, err := os.MkdirTemp("", "examples-test-")
		if err != nil {
			build.err = err
			return
		}
		build.dir = dir
		build.bin = filepath.Join(dir, "myriarch-bridge")
		if out, err := exec.Command("go", "build", "-o", build.bin, "../cmd/myriarch-bridge").CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.bin
}

var build struct {
	sync.Once
	dir, bin string
	err      error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
	os.Exit(code)
}

// prepare copies an example next to dummy secrets: the files name
// /etc/myriarch-bridge/secrets/..., which check reads.
func prepare(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	for _, s := range []string{"lease-dsn", "cloud-password"} {
		if err := os.WriteFile(filepath.Join(dir, s), []byte("secret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(b), "/etc/myriarch-bridge/secrets/", dir+"/")
	p := filepath.Join(dir, filepath.Base(name))
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

type report struct {
	Admitted bool     `json:"admitted"`
	Errors   []string `json:"errors"`
	Warnings []string `json:"warnings"`
	Sessions []struct {
		SessionID  string   `json:"session_id"`
		OwnerDeath float64  `json:"owner_death_budget_s"`
		BrokerPath *float64 `json:"broker_path_budget_s"`
	} `json:"sessions"`
}

func check(t *testing.T, bin, file string) (report, int) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(bin, "check", "-c", file, "--json")
	cmd.Env = append(os.Environ(), "MYRIARCH_SOURCE_PASSWORD=secret")
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var r report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%s: not JSON: %v\n%s\n%s", file, err, out.String(), errb.String())
	}
	return r, code
}

// Every example is a valid configuration whose objective is admitted, with
// the budgets its comments quote.
func TestExamplesPassCheck(t *testing.T) {
	bin := buildBridge(t)
	want := map[string]struct {
		session    string
		ownerDeath float64
		brokerPath float64 // 0: broker-path failover off
	}{
		"standalone-file.yaml":    {"plant", 1097.5, 0},
		"clustered-postgres.yaml": {"plant", 336.5, 380},
		"clustered-etcd.yaml":     {"commands", 116, 161},
		"mqtt311-legacy.yaml":     {"plant", 1097.5, 0},
	}
	files, _ := filepath.Glob("*.yaml")
	if len(files) != len(want) {
		t.Fatalf("examples %v, the test knows %d", files, len(want))
	}
	for _, f := range files {
		w, ok := want[f]
		if !ok {
			t.Errorf("%s: not known to the test", f)
			continue
		}
		r, code := check(t, bin, prepare(t, f))
		if code != 0 || !r.Admitted || len(r.Errors) > 0 {
			t.Errorf("%s: exit %d, admitted %v, errors %v", f, code, r.Admitted, r.Errors)
			continue
		}
		if len(r.Sessions) != 1 || r.Sessions[0].SessionID != w.session || r.Sessions[0].OwnerDeath != w.ownerDeath {
			t.Errorf("%s: sessions %+v, want %s with owner-death budget %v", f, r.Sessions, w.session, w.ownerDeath)
			continue
		}
		bp := r.Sessions[0].BrokerPath
		if (w.brokerPath == 0) != (bp == nil) || bp != nil && *bp != w.brokerPath {
			t.Errorf("%s: broker-path budget %v, want %v", f, bp, w.brokerPath)
		}
	}
}

// The check is not a rubber stamp: the clustered example with an objective
// below its budget is refused.
func TestCheckRefusesATightObjective(t *testing.T) {
	bin := buildBridge(t)
	p := prepare(t, "clustered-postgres.yaml")
	b, _ := os.ReadFile(p)
	if err := os.WriteFile(p, bytes.ReplaceAll(b, []byte("failover_slo: 10m"), []byte("failover_slo: 5m")), 0o600); err != nil {
		t.Fatal(err)
	}
	r, code := check(t, bin, p)
	if code != 2 || r.Admitted || len(r.Errors) == 0 || !strings.Contains(strings.Join(r.Errors, "\n"), "failover_slo") {
		t.Fatalf("exit %d, admitted %v, errors %v", code, r.Admitted, r.Errors)
	}
}

// The MQTT 3.1.1 example says what 3.1.1 cannot do: the broker keeps the
// session, and the historian gets no fencing stamp.
func TestMQTT311ExampleWarns(t *testing.T) {
	bin := buildBridge(t)
	r, code := check(t, bin, prepare(t, "mqtt311-legacy.yaml"))
	if code != 0 || !r.Admitted {
		t.Fatalf("exit %d, admitted %v, errors %v", code, r.Admitted, r.Errors)
	}
	all := strings.Join(r.Warnings, "\n")
	for _, w := range []string{`session "plant" speaks MQTT 3.1.1, which has no session expiry interval`,
		`sender "historian" publishes MQTT 3.1.1, which has no user properties`} {
		if !strings.Contains(all, w) {
			t.Errorf("no warning %q in:\n%s", w, all)
		}
	}
}
