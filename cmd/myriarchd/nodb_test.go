package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/myriarch/myriarch/internal/fleet/apiclient"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// dbCommands are the commands that may open the database: the replica
// itself (serve, and its --dev), migrate, and the first admin token. The
// labs are another program (myriarch-lab).
var dbCommands = []string{"serve", "migrate", "token bootstrap"}

// localCommands are the commands that call neither the API nor the
// database: they read local files only.
var localCommands = []string{"budget", "context", "version", "--version", "failover-lab"}

// connRecorder is a TCP listener that counts the connections it accepts
// and closes them: a database URL that points at it shows whether a
// command tried to open the database.
type connRecorder struct {
	ln   net.Listener
	n    atomic.Int64
	wg   sync.WaitGroup
	addr string
}

func newConnRecorder(t *testing.T) *connRecorder {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &connRecorder{ln: ln, addr: ln.Addr().String()}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.n.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); r.wg.Wait() })
	return r
}

// countingTransport counts the API requests of the commands.
type countingTransport struct {
	base http.RoundTripper
	n    atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.base.RoundTrip(r)
}

// dbProbe runs commands with the database settings (MYRIARCH_DATABASE_URL
// and the file of MYRIARCH_CONFIG) pointing at a connRecorder, and
// reports each command after which a connection arrived, or that made
// no API request.
type dbProbe struct {
	rec   *connRecorder
	calls *countingTransport
}

func newDBProbe(t *testing.T) *dbProbe {
	rec := newConnRecorder(t)
	url := "postgres://myriarch:secret@" + rec.addr + "/fleet?connect_timeout=2&sslmode=disable"
	t.Setenv("MYRIARCH_DATABASE_URL", url)
	cfg := filepath.Join(t.TempDir(), "myriarchd.yaml")
	if err := os.WriteFile(cfg, []byte("database:\n  url: "+url+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MYRIARCH_CONFIG", cfg)
	calls := &countingTransport{base: apiTransport}
	if calls.base == nil {
		calls.base = http.DefaultTransport
	}
	old := apiTransport
	apiTransport = calls
	t.Cleanup(func() { apiTransport = old })
	return &dbProbe{rec: rec, calls: calls}
}

// check runs the command args through run and returns what is wrong:
// a database connection, or (wantAPI) no API request.
func (p *dbProbe) check(args []string, wantAPI bool, run func(args []string, stdout, stderr io.Writer) int) string {
	db, api := p.rec.n.Load(), p.calls.n.Load()
	var out, errb syncBuf
	code := run(args, &out, &errb)
	switch {
	case p.rec.n.Load() != db:
		return fmt.Sprintf("%q opened the database (exit %d, %s)", args, code, errb.String())
	case wantAPI && p.calls.n.Load() == api:
		return fmt.Sprintf("%q made no API request (exit %d, %s)", args, code, errb.String())
	}
	return ""
}

// exampleArgs fills a command's positional arguments and the flags that
// it needs before it calls the API.
func exampleArgs(c apiCmd, file string) []string {
	args := []string{c.group}
	if c.name != "" {
		args = append(args, c.name)
	}
	for _, a := range c.args {
		switch strings.Trim(a, "[]") {
		case "UID":
			a = "00000000-0000-4000-8000-0000000000d1"
		case "ID", "REVISION", "FROM", "TO":
			a = "1"
		case "VERSION":
			a = "1.0.0"
		default:
			a = "nodb"
		}
		args = append(args, a)
	}
	for flag, val := range map[string]string{"file": file, "name": "nodb", "role": "viewer", "type": "yaml"} {
		if _, ok := c.flags[flag]; ok {
			args = append(args, "--"+flag, val)
		}
	}
	return args
}

// TestAPICommandsNeverOpenTheDatabase: every command of the command table
// runs against a replica with the database settings pointing at a
// listener that records connections; none may connect to it, and each
// must have called the API. Every registered command is either in the
// table, one of dbCommands, or one of localCommands, so a new command
// must be placed. The planted command, which opens the database as the
// old `config` commands did, is caught.
func TestAPICommandsNeverOpenTheDatabase(t *testing.T) {
	pg := pgtest.New(t)
	d := inProcessReplica(t, pg.DSN(""), "replica-nodb", nil)
	tok, err := d.Store.CreateToken(t.Context(), "nodb")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MYRIARCH_SERVER", "http://"+d.HTTPAddr().String())
	t.Setenv("MYRIARCH_TOKEN", tok)
	t.Setenv("MYRIARCH_CONTEXTS", filepath.Join(t.TempDir(), "contexts.yaml"))
	file := filepath.Join(t.TempDir(), "content.yaml")
	if err := os.WriteFile(file, []byte("a: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	probe := newDBProbe(t)

	groups := map[string]bool{}
	for _, c := range apiCommands {
		groups[c.group] = true
		if msg := probe.check(exampleArgs(c, file), true, commands.Dispatch); msg != "" {
			t.Error(msg)
		}
	}
	if len(apiCommands) < 40 {
		t.Fatalf("only %d API commands in the table", len(apiCommands))
	}
	for _, args := range [][]string{{"context", "set", "x", "--server", "http://127.0.0.1:1"}, {"context", "list"}, {"context", "show"},
		{"context", "use", "x"}, {"context", "delete", "x"}, {"version"}, {"budget"}} {
		if msg := probe.check(args, false, commands.Dispatch); msg != "" {
			t.Error(msg)
		}
	}
	for _, name := range commands.Names() {
		if !groups[name] && !slices.Contains(localCommands, name) && !slices.Contains(dbCommands, name) && name != "token" {
			t.Errorf("command %q is neither an API command (apiCommands), a local one nor one allowed to open the database: place it", name)
		}
	}

	// The allowed one does connect (the probe sees it), and a planted API
	// command that opens the database is reported.
	if msg := probe.check([]string{"token", "bootstrap", "--name", "x"}, false, commands.Dispatch); !strings.Contains(msg, "opened the database") {
		t.Fatalf("token bootstrap did not reach the recorder: %q", msg)
	}
	planted := apiCmd{group: "planted", name: "list", summary: "opens the database as the old config commands did",
		run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
			st, code := openDB(ctx, x.prog, os.Getenv("MYRIARCH_CONFIG"), x.stderr)
			if st != nil {
				st.Close()
			}
			return nil, nil, fmt.Errorf("exit %d", code)
		}}
	msg := probe.check([]string{"list"}, true, func(args []string, stdout, stderr io.Writer) int {
		return runAPI(&planted, "", args, stdout, stderr)
	})
	if !strings.Contains(msg, `["list"] opened the database`) {
		t.Fatalf("the planted command was not caught: %q", msg)
	}
}
