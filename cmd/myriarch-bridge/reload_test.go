package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/runtime"
)

// SIGHUP reloads the file: a new route is served without a failover, and
// a file refused by admission is logged and changes nothing.
func TestSIGHUPReloads(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a bridge process")
	}
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	sk, sk2 := newSeqSink(t), newSeqSink(t)
	dir := t.TempDir()
	render := func(slo string, second bool) string {
		y := e2eConfig
		if second {
			y = strings.Replace(y, "routes:\n", e2eSecondRoute, 1)
		}
		// Port 0: a port found free here and bound by the process later
		// could be taken in between; the process logs the one it bound.
		y = strings.Replace(y, `listen: "off"`, `listen: "127.0.0.1:0"`, 1)
		return strings.NewReplacer("LEASEDB", filepath.Join(dir, "lease.db"), "BROKER", br.URL, "SINK2", sk2.srv.URL,
			"SINK", sk.srv.URL, "TTL", "5s", "SLO", slo).Replace(y)
	}
	p := startBridgeProc(t, dir, render("60s", false))
	addr := p.httpAddr(t)
	status := func() (st runtime.Status) {
		resp, err := http.Get("http://" + addr + "/status")
		if err != nil {
			return st
		}
		defer resp.Body.Close()
		_ = json.NewDecoder(resp.Body).Decode(&st)
		return st
	}
	var version int64
	eventually(t, "the bridge owns and serves", time.Minute, func() bool {
		st := status()
		if len(st.Sessions) != 1 || st.Sessions[0].Role != "owner" || st.Sessions[0].ServiceLevel != "full" {
			return false
		}
		version = st.Sessions[0].LeaseVersion
		return true
	})
	file := filepath.Join(dir, "bridge.yaml")
	hup := func(body string) {
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	hup(render("60s", true))
	eventually(t, "the new route after SIGHUP", time.Minute, func() bool {
		st := status()
		return len(st.Sessions) == 1 && fmt.Sprint(st.Sessions[0].Routes) == "[r2 r]"
	})
	hup(render("1s", false))
	eventually(t, "the refusal logged", time.Minute, func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, "bridge.log"))
		return strings.Contains(string(b), "SIGHUP: configuration refused; nothing changed") && strings.Contains(string(b), "failover_slo")
	})
	st := status()
	if len(st.Sessions) != 1 || fmt.Sprint(st.Sessions[0].Routes) != "[r2 r]" || st.Sessions[0].LeaseVersion != version || st.Sessions[0].Role != "owner" {
		t.Fatalf("after SIGHUP reloads: %+v; want owner at lease version %d with routes [r2 r]", st.Sessions, version)
	}
}

// httpAddr is the address of the process's HTTP listener, from its log
// line "serving /live /ready /status /metrics" (text format: addr=host:port).
func (p *bridgeProc) httpAddr(t *testing.T) string {
	t.Helper()
	var addr string
	eventually(t, "the bridge logs its HTTP address", time.Minute, func() bool {
		b, _ := os.ReadFile(filepath.Join(p.dir, "bridge.log"))
		for line := range strings.Lines(string(b)) {
			if !strings.Contains(line, "serving /live") || !strings.HasSuffix(line, "\n") {
				continue
			}
			for f := range strings.FieldsSeq(line) {
				if a, ok := strings.CutPrefix(f, "addr="); ok {
					addr = a
					return true
				}
			}
		}
		return false
	})
	return addr
}
