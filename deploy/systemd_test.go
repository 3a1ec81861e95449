package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// systemd-analyze verify accepts both units without a word: it reports
// unknown keys and values it cannot parse, which systemd itself would only
// log and ignore. The binaries are replaced by /bin/true, which exists.
func TestSystemdAnalyzeVerify(t *testing.T) {
	tool, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("systemd-analyze not found (apt-get install systemd); CI needs it")
		}
		t.Skip("systemd-analyze not found (apt-get install systemd)")
	}
	units, _ := filepath.Glob("systemd/*.service")
	if len(units) != 2 {
		t.Fatalf("units %v", units)
	}
	dir := t.TempDir()
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.NewReplacer("/usr/local/bin/myriarch-bridge", "/bin/true", "/usr/local/bin/myriarchd", "/bin/true").Replace(string(b))
		p := filepath.Join(dir, filepath.Base(u))
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(tool, "verify", p).CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", u, err, out)
		}
	}
	// The check bites: a value systemd cannot parse is reported.
	p := filepath.Join(dir, "bad.service")
	if err := os.WriteFile(p, []byte("[Service]\nExecStart=/bin/true\nRestart=bogus\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ := exec.Command(tool, "verify", p).CombinedOutput(); !strings.Contains(string(out), "bogus") {
		t.Fatalf("systemd-analyze verify let Restart=bogus pass: %s", out)
	}
}
