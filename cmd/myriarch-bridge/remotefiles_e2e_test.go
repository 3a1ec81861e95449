package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bridgeconfig "github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/fleet/configs"
)

// The myriarchd that these tests assemble (daemon.Start) validates bridge
// configurations as cmd/myriarchd does (its validators.go): with the
// bridge's remote check registered for the myriarch-bridge type.
func init() {
	configs.RegisterValidator(configs.TypeBridge, bridgeconfig.ValidateRemote)
}

// The files that a bridge configuration names are the bridge host's: a
// configuration whose password file exists only in the bridge's directory
// (a relative path, the bridge's working directory) is accepted by
// myriarchd's API and applied by the bridge, which reads the password there
// (the broker admits only that password); one that names files missing on
// the bridge's host is accepted by myriarchd too, and the bridge reports it
// FAILED naming each missing file, changing nothing.
func TestRemoteConfigFilesAreCheckedOnTheBridgesHost(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, myriarchd and a bridge process")
	}
	ctx := context.Background()
	d, tok := startMyriarchd(t, "e2e-files")
	const password = "only-on-the-bridge-host"
	br, err := embroker.StartWith("", nil, embroker.Options{Users: map[string]string{"plant": password}})
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	sk, sk2 := newSeqSink(t), newSeqSink(t)

	dir := filepath.Join(t.TempDir(), "bridge")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pw"), []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("pw"); err == nil {
		t.Fatal("a file pw in the test's working directory: the test needs it only in the bridge's")
	}
	render := func(pwFile string, second bool, extra string) string {
		y := e2eConfig
		if second {
			y = strings.Replace(y, "routes:\n", e2eSecondRoute, 1)
		}
		y = strings.Replace(y, "    client_id: plant-bridge\n", "    client_id: plant-bridge\n    username: plant\n    password_file: "+pwFile+"\n"+extra, 1)
		return strings.NewReplacer("LEASEDB", "lease.db", "BROKER", br.URL, "SINK2", sk2.srv.URL,
			"SINK", sk.srv.URL, "TTL", "5s", "SLO", "60s").Replace(y)
	}
	p := startBridgeProc(t, dir, render("pw", false, "")+strings.ReplaceAll(e2eOpAMP, "OPAMP", d.OpAMPAddr().String()))
	eventually(t, "the bridge's instance uid", time.Minute, func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "plant-opamp-instance-uid"))
		p.uid = strings.TrimSpace(string(b))
		return err == nil && p.uid != ""
	})
	eventually(t, "the bridge's session owned at full, with the password from its file", time.Minute, func() bool {
		a, err := d.Store.GetAgent(ctx, p.uid)
		s := session(a)
		return err == nil && s["role"] == "owner" && s["service_level"] == "full"
	})

	put := func(body string) string {
		t.Helper()
		b, _ := json.Marshal(map[string]string{"config": body})
		req, _ := http.NewRequest("PUT", "http://"+d.HTTPAddr().String()+"/api/v1/agents/"+p.uid+"/config", bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		var r struct {
			Hash string `json:"config_hash"`
		}
		if resp.StatusCode != http.StatusAccepted || json.Unmarshal(out, &r) != nil || r.Hash == "" {
			t.Fatalf("myriarchd refused a configuration whose files are the bridge host's: %d %s", resp.StatusCode, out)
		}
		return r.Hash
	}
	reported := func(hash, status string) func() bool {
		return func() bool {
			a, err := d.Store.GetAgent(ctx, p.uid)
			return err == nil && a.RemoteConfigHash == hash && a.RemoteConfigStatus == status
		}
	}

	// 1. The password file exists in the bridge's directory only.
	h := put(render("pw", true, ""))
	eventually(t, "the configuration with the bridge's password file applied", time.Minute, reported(h, "applied"))
	onDisk, err := os.ReadFile(filepath.Join(dir, "bridge.yaml"))
	if err != nil || !bytes.Contains(onDisk, []byte("id: r2")) {
		t.Fatalf("the applied configuration is not on disk: %v\n%s", err, onDisk)
	}

	// 2. Files missing on the bridge's host: stored by myriarchd, FAILED
	// by the bridge with each file named, nothing changed.
	h = put(render("missing-pw", true, "    tls: {ca_file: missing-ca.pem}\n"))
	eventually(t, "FAILED reported for the missing files", time.Minute, reported(h, "failed"))
	a, err := d.Store.GetAgent(ctx, p.uid)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`sessions[0].password_file: "missing-pw": cannot be read`, `sessions[0].tls.ca_file: "missing-ca.pem": cannot be read`} {
		if !strings.Contains(a.RemoteConfigError, want) {
			t.Errorf("FAILED without %q: %q", want, a.RemoteConfigError)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "bridge.yaml")); !bytes.Equal(b, onDisk) {
		t.Fatal("a refused configuration changed the file on disk")
	}
	if s := session(a); s["role"] != "owner" || s["service_level"] != "full" {
		t.Fatalf("after a refused configuration the bridge reports %v", s)
	}
}
