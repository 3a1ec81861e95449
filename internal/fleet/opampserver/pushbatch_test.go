package opampserver

import (
	"context"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// One batch of notifications (duplicates, an agent connected nowhere, a
// plain-HTTP agent among WebSocket ones) reaches every agent connected
// here, each once.
func TestPushBatchDeliversToEveryAgentOnce(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	r := newRig(t, st, "replica-a", "n1")
	defer r.stop(t)
	var agents []*fleettest.Agent
	for range 5 {
		agents = append(agents, startAgent(t, fleettest.AgentOptions{URL: r.ws}))
	}
	agents = append(agents, startAgent(t, fleettest.AgentOptions{URL: r.url, HTTP: true, Heartbeat: 50 * time.Millisecond}))
	payloads := []string{"0123456789abcdef0123456789abcdef"} // connected nowhere
	for _, a := range agents {
		agentIs(t, st, a.UIDString(), func(a store.Agent) bool { return a.Status == "online" && a.Healthy != nil })
		if _, err := st.SetDesiredConfig(ctx, a.UIDString(), "receivers: {otlp: {}}\n"); err != nil {
			t.Fatal(err)
		}
		payloads = append(payloads, a.UIDString(), a.UIDString())
	}
	r.srv.PushBatch(ctx, payloads)
	for _, a := range agents {
		agentIs(t, st, a.UIDString(), func(a store.Agent) bool { return a.RemoteConfigStatus == "applied" })
		if n := len(a.Configs()); n != 1 {
			t.Errorf("agent %s received %d configs, want 1", a.UIDString(), n)
		}
	}
}
