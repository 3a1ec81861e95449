package apiclient

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The contexts file: written 0600, refused when others may read it, and
// the precedence flag > --context > environment > current context.
func TestContextsFileModeAndPrecedence(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "contexts.yaml")
	t.Setenv(ContextsEnv, path)
	for _, k := range []string{"MYRIARCH_SERVER", "MYRIARCH_TOKEN", "MYRIARCH_CA_FILE"} {
		t.Setenv(k, "")
	}
	cs, err := LoadContexts(path)
	if err != nil || len(cs.Contexts) != 0 {
		t.Fatalf("missing file: %v %+v", err, cs)
	}
	cs.Set(Context{Name: "prod", Server: "https://prod:8080", Token: "myr_prod"})
	cs.Set(Context{Name: "lab", Server: "http://lab:8080", Token: "myr_lab"})
	if err := cs.Save(); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v %v", st.Mode(), err)
	}
	resolve := func(r Resolve) Options {
		t.Helper()
		o, err := r.Options()
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	if o := resolve(Resolve{}); o.Server != "https://prod:8080" || o.Token != "myr_prod" {
		t.Fatalf("current context (the first set): %+v", o)
	}
	t.Setenv("MYRIARCH_TOKEN", "myr_env")
	// The environment's token is not sent to the current context's
	// server, which has a token of its own (after `context use lab`, a
	// prod token in the environment went to the lab); nor the context's
	// token to another server in MYRIARCH_SERVER.
	if _, err := (Resolve{}).Options(); err == nil || !strings.Contains(err.Error(), `MYRIARCH_TOKEN is set but MYRIARCH_SERVER is not: the token would go to https://prod:8080, the server of the current context "prod"`) {
		t.Fatalf("environment token to the current context's server: %v", err)
	}
	t.Setenv("MYRIARCH_SERVER", "https://other:8080")
	if o := resolve(Resolve{}); o.Server != "https://other:8080" || o.Token != "myr_env" {
		t.Fatalf("environment over the current context: %+v", o)
	}
	if o := resolve(Resolve{Server: "https://flag:8080"}); o.Server != "https://flag:8080" || o.Token != "myr_env" {
		t.Fatalf("--server with the environment's token: %+v", o)
	}
	t.Setenv("MYRIARCH_TOKEN", "")
	if _, err := (Resolve{}).Options(); err == nil || !strings.Contains(err.Error(), `MYRIARCH_SERVER https://other:8080 is set but MYRIARCH_TOKEN is not: the token would be the current context "prod"'s`) {
		t.Fatalf("context token to the environment's server: %v", err)
	}
	t.Setenv("MYRIARCH_SERVER", "https://prod:8080")
	if o := resolve(Resolve{}); o.Server != "https://prod:8080" || o.Token != "myr_prod" {
		t.Fatalf("MYRIARCH_SERVER naming the context's own server: %+v", o)
	}
	t.Setenv("MYRIARCH_SERVER", "")
	t.Setenv("MYRIARCH_TOKEN", "myr_env")
	// A context named on the command line wins over the environment: the
	// environment's token is not sent to the lab.
	if o := resolve(Resolve{Context: "lab"}); o.Server != "http://lab:8080" || o.Token != "myr_lab" {
		t.Fatalf("--context over the environment: %+v", o)
	}
	if o := resolve(Resolve{Context: "lab", Token: "myr_flag"}); o.Token != "myr_flag" {
		t.Fatalf("flag over --context: %+v", o)
	}
	if _, err := (Resolve{Context: "nope"}).Options(); err == nil || !strings.Contains(err.Error(), `context "nope": not in`) || !strings.Contains(err.Error(), "prod, lab") {
		t.Fatalf("unknown context: %v", err)
	}
	// A context without a token takes the environment's: the token kept
	// out of the file, e.g. in a CI secret.
	cs.Set(Context{Name: "ci", Server: "https://ci:8080"})
	cs.Current = "ci"
	if err := cs.Save(); err != nil {
		t.Fatal(err)
	}
	if o := resolve(Resolve{}); o.Server != "https://ci:8080" || o.Token != "myr_env" {
		t.Fatalf("context without a token, token in the environment: %+v", o)
	}

	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadContexts(path); err == nil || !strings.Contains(err.Error(), "mode 0644: must be readable by its owner only") || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a readable contexts file was accepted: %v", err)
	}
	if _, err := (Resolve{}).Options(); err == nil {
		t.Fatal("a command used a contexts file that others can read")
	}
	os.Chmod(path, 0o600)
	if err := os.WriteFile(path, []byte("current: x\ncontexts: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadContexts(path); err == nil || !strings.Contains(err.Error(), `current "x": no context has this name`) {
		t.Fatalf("dangling current: %v", err)
	}
	if err := os.WriteFile(path, []byte("contexts: [{name: a, server: x, tokn: y}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadContexts(path); err == nil || !strings.Contains(err.Error(), "tokn") {
		t.Fatalf("unknown key: %v", err)
	}
}

// New refuses what cannot work, naming the setting.
func TestNewRefusesBadOptions(t *testing.T) {
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Server: "localhost:8080", Token: "t"}, `server "localhost:8080": must be an http:// or https:// URL`},
		{Options{Server: "http://x"}, "token: required"},
		{Options{Server: "http://x", Token: "a b"}, "token: must not contain white space"},
		{Options{Server: "https://x", Token: "t", CAFile: "/nonexistent/ca.pem"}, "ca file:"},
	} {
		if _, err := New(c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.o, err, c.want)
		}
	}
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, []byte("not a certificate"), 0o600)
	if _, err := New(Options{Server: "https://x", Token: "t", CAFile: ca}); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("bad CA: %v", err)
	}
}
