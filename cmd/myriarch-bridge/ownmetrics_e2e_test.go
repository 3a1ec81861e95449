package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
)

type telemetrySeries struct {
	Name      string       `json:"name"`
	Component string       `json:"component"`
	Unit      string       `json:"unit"`
	Points    [][2]float64 `json:"points"`
}

// agentTelemetry reads GET /api/v1/agents/{uid}/telemetry.
func agentTelemetry(t *testing.T, api, tok, uid, window string) map[string]telemetrySeries {
	req, _ := http.NewRequest("GET", api+"/api/v1/agents/"+uid+"/telemetry?window="+window, nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var w struct {
		Series []telemetrySeries `json:"series"`
	}
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&w) != nil {
		return nil
	}
	out := map[string]telemetrySeries{}
	for _, s := range w.Series {
		out[s.Name+"|"+s.Component] = s
	}
	return out
}

func lastValue(s telemetrySeries) float64 {
	if len(s.Points) == 0 {
		return -1
	}
	return s.Points[len(s.Points)-1][1]
}

// TestBridgeOwnMetricsReachMyriarchd is issue 27's end-to-end test for
// the bridge: myriarchd offers two bridge processes the own-metrics
// destination with their credential; the owner's route rates (received,
// delivered) and its session's budget and SLO appear in the agent's
// telemetry; when the owner is killed, the standby's takeover appears with
// its failure-to-full, within the budget.
func TestBridgeOwnMetricsReachMyriarchd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, myriarchd and two bridge processes")
	}
	ctx := context.Background()
	d, tok := startMyriarchd(t, "own-metrics", "telemetry.flushInterval=200ms")
	api := "http://" + d.HTTPAddr().String()
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	sk := newSeqSink(t)
	root := t.TempDir()
	cfg := strings.NewReplacer("LEASEDB", filepath.Join(root, "lease.db"), "BROKER", br.URL, "SINK", sk.srv.URL,
		"TTL", "5s", "SLO", "60s").Replace(e2eConfig) + strings.ReplaceAll(e2eOpAMP, "OPAMP", d.OpAMPAddr().String())
	var procs []*bridgeProc
	for _, name := range []string{"a", "b"} {
		dir := filepath.Join(root, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		p := startBridgeProc(t, dir, cfg)
		procs = append(procs, p)
		eventually(t, "the instance uid of "+name, time.Minute, func() bool {
			b, err := os.ReadFile(filepath.Join(dir, "plant-opamp-instance-uid"))
			p.uid = strings.TrimSpace(string(b))
			return err == nil && p.uid != ""
		})
	}
	pubc, err := embroker.Connect(ctx, br.URL, "own-metrics-publisher", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pubc.Close()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
				_, _ = pubc.Publish(ctx, &paho.Publish{Topic: "in/x", QoS: 1, Payload: fmt.Append(nil, n)})
			}
		}
	}()
	defer func() { close(stop); <-done }()

	// The owner's rates: two sends (one interval apart) make a rate.
	var owner, standby *bridgeProc
	eventually(t, "the owner's received and delivered rates and its session's budget in its telemetry", 90*time.Second, func() bool {
		for i, p := range procs {
			s := agentTelemetry(t, api, tok, p.uid, "5m")
			if lastValue(s["received|route/r"]) > 0 && lastValue(s["delivered|route/r"]) > 0 && lastValue(s["takeover.budget|session/plant"]) > 0 &&
				lastValue(s["takeover.slo|session/plant"]) == 60 {
				owner, standby = p, procs[1-i]
				return true
			}
		}
		return false
	})
	s := agentTelemetry(t, api, tok, owner.uid, "5m")
	t.Logf("owner %s: received %.1f msg/s, delivered %.1f msg/s, budget %.1fs", owner.uid,
		lastValue(s["received|route/r"]), lastValue(s["delivered|route/r"]), lastValue(s["takeover.budget|session/plant"]))
	if u := s["received|route/r"].Unit; u != "messages/s" {
		t.Fatalf("unit %q", u)
	}

	// Kill the owner: the standby takes over and reports its takeover.
	_ = owner.cmd.Process.Signal(syscall.SIGKILL)
	eventually(t, "the standby's takeover with its failure-to-full in its telemetry", 90*time.Second, func() bool {
		s := agentTelemetry(t, api, tok, standby.uid, "5m")
		return lastValue(s["takeover.failure_to_full|session/plant"]) > 0
	})
	s = agentTelemetry(t, api, tok, standby.uid, "5m")
	ff, budget := lastValue(s["takeover.failure_to_full|session/plant"]), lastValue(s["takeover.budget|session/plant"])
	t.Logf("takeover: failure-to-full %.2fs against the owner-death budget %.1fs", ff, budget)
	if budget <= 0 || ff > budget {
		t.Fatalf("failure-to-full %.2fs, budget %.1fs", ff, budget)
	}
	// The standby never sends the owner's series: each agent writes only
	// its own.
	if lastValue(agentTelemetry(t, api, tok, owner.uid, "5m")["takeover.failure_to_full|session/plant"]) > 0 {
		t.Fatal("the killed owner has a takeover it did not make")
	}
}
