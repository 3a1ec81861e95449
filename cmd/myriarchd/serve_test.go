package main

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/pgtest"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func get(t *testing.T, url, token string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// The README's main job: `myriarchd --dev` on a fresh machine, then
// `myriarchd token create` through its API with the printed admin token,
// then SIGTERM.
func TestServeDevAndTokenCreate(t *testing.T) {
	if _, err := pgtest.BinDir(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	// Not t.TempDir: its parent is private, and as root PostgreSQL runs as
	// the postgres user, which must reach the data directory.
	dir, err := os.MkdirTemp("", "myriarchd-serve-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	t.Setenv("MYRIARCH_SERVER_HTTPLISTEN", "127.0.0.1:0")
	t.Setenv("MYRIARCH_SERVER_OPAMPLISTEN", "127.0.0.1:0")
	t.Setenv("MYRIARCH_LOG_LEVEL", "warn")
	var stdout, stderr syncBuf
	done := make(chan int, 1)
	go func() {
		done <- commands.Dispatch([]string{"--dev", "--dev-dir", filepath.Join(dir, "dev")}, &stdout, &stderr)
	}()

	re := regexp.MustCompile(`UI:\s+(http://\S+)/ui/\n\s+admin token:\s+(myr_\S+)\n.*\n\s+PostgreSQL:\s+(\S+)`)
	var m []string
	deadline := time.Now().Add(2 * time.Minute)
	for m == nil {
		select {
		case code := <-done:
			t.Fatalf("serve --dev exited with %d: %s %s", code, stdout.String(), stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no start-up banner: %s %s", stdout.String(), stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
		m = re.FindStringSubmatch(stdout.String())
	}
	base, admin := m[1], m[2]
	if code := get(t, base+"/api/v1/cluster", admin); code != 200 {
		t.Fatalf("cluster with the admin token: %d", code)
	}
	if code := get(t, base+"/api/v1/cluster", ""); code != 401 {
		t.Fatalf("cluster without token: %d", code)
	}

	// The README's next step: more tokens through the API with the
	// admin token; the database is not needed (nor its URL known).
	t.Setenv("MYRIARCH_SERVER", base)
	t.Setenv("MYRIARCH_TOKEN", admin)
	var tout, terr syncBuf
	if code := commands.Dispatch([]string{"token", "create", "--name", "ci", "--role", "operator"}, &tout, &terr); code != 0 {
		t.Fatalf("token create: %d %s", code, terr.String())
	}
	tok := strings.TrimSpace(tout.String())
	if !strings.HasPrefix(tok, "myr_") || get(t, base+"/api/v1/agents", tok) != 200 {
		t.Fatalf("created token %q does not work", tok)
	}
	if code := commands.Dispatch([]string{"token", "create"}, &tout, &terr); code != 2 {
		t.Fatalf("token create without --name: %d", code)
	}

	// A planned stop through the signal, as Kubernetes or systemd send it.
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("serve did not stop on SIGTERM")
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Fatal("HTTP still served after the stop")
	}
	if _, err := os.Stat(filepath.Join(dir, "dev", "pg", "data", "postmaster.pid")); !os.IsNotExist(err) {
		t.Fatalf("dev PostgreSQL still running: %v", err)
	}
}

func TestServeRefusesABadConfiguration(t *testing.T) {
	t.Setenv("MYRIARCH_HA_LEADERSESSIONTIMEOUT", "5s")
	var out, errb syncBuf
	if code := commands.Dispatch([]string{"serve"}, &out, &errb); code != 2 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{`ha.leaderSessionTimeout: "5s" (from MYRIARCH_HA_LEADERSESSIONTIMEOUT)`, "database.url", "server.enrollmentSecret"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("missing %q in %s", want, errb.String())
		}
	}
}
