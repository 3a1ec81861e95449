package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// `myriarchd context` keeps several clusters; a command calls the current
// one, or the one --context names, with that context's token.
func TestContextCommands(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	server := func(name string) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			seen = append(seen, name+" "+r.Header.Get("Authorization"))
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"agents": {"total": 0, "online": 0, "offline": 0, "unhealthy": 0}, "replica_id": "` + name + `", "leader": null}`))
		}))
		t.Cleanup(s.Close)
		return s
	}
	prod, lab := server("prod"), server("lab")
	path := filepath.Join(t.TempDir(), "contexts.yaml")
	t.Setenv("MYRIARCH_CONTEXTS", path)
	t.Setenv("MYRIARCH_SERVER", "")
	t.Setenv("MYRIARCH_TOKEN", "")
	run := func(args ...string) (string, string, int) {
		var out, errb syncBuf
		code := commands.Dispatch(args, &out, &errb)
		return out.String(), errb.String(), code
	}
	must := func(args ...string) string {
		t.Helper()
		out, errOut, code := run(args...)
		if code != 0 {
			t.Fatalf("%q: %d %s %s", args, code, out, errOut)
		}
		return out
	}
	must("context", "set", "prod", "--server", prod.URL, "--token", "myr_prod")
	must("context", "set", "lab", "--server", lab.URL, "--token", "myr_lab")
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("contexts file: %v %v", st, err)
	}
	if out := must("context", "list"); !strings.Contains(out, "*        prod") {
		t.Fatalf("list: %q", out)
	}
	if out := must("overview", "-o", "json"); !strings.Contains(out, `"replica_id": "prod"`) {
		t.Fatalf("overview on the current context: %q", out)
	}
	must("context", "use", "lab")
	if out := must("overview"); !strings.Contains(out, "agents     0: 0 online") || !strings.Contains(out, "answered   by lab") {
		t.Fatalf("overview on lab: %q", out)
	}
	must("overview", "--context", "prod")
	if out := must("context", "show"); !strings.Contains(out, "lab") || strings.Contains(out, "myr_lab") {
		t.Fatalf("show: %q", out)
	}
	mu.Lock()
	got := strings.Join(seen, "; ")
	mu.Unlock()
	if got != "prod Bearer myr_prod; lab Bearer myr_lab; prod Bearer myr_prod" {
		t.Fatalf("requests: %s", got)
	}
	if _, errOut, code := run("overview", "--context", "nope"); code != 2 || !strings.Contains(errOut, `context "nope": not in`) {
		t.Fatalf("unknown context: %d %q", code, errOut)
	}
	if _, errOut, code := run("context", "set", "bad", "--server", "lab:8080"); code != 2 || !strings.Contains(errOut, `server "lab:8080"`) {
		t.Fatalf("bad server: %d %q", code, errOut)
	}
	os.Chmod(path, 0o640)
	if _, errOut, code := run("overview"); code != 2 || !strings.Contains(errOut, "chmod 600") {
		t.Fatalf("readable contexts file: %d %q", code, errOut)
	}
	os.Chmod(path, 0o600)
	must("context", "delete", "lab")
	if out := must("context", "list"); strings.Contains(out, "lab") {
		t.Fatalf("after delete: %q", out)
	}
}
