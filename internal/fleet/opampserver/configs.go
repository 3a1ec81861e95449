package opampserver

import (
	"context"
	"encoding/hex"
	"log/slog"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// Remote configs
//
// An agent's desired config goes out when it differs from the one the
// agent reported and from the one last sent to it, and only once the
// agent has told which config it runs (see reported.known): a WebSocket
// agent gets it in the response to its full state, then by push; a
// plain-HTTP agent in the response to a poll after a change, again on
// every such poll until it reports it.

// configSender delivers desired configs to the agents served here.
type configSender struct {
	store *store.Store
	ev    events
	log   *slog.Logger
}

// remoteConfig is the OpAMP form of a desired config. An empty body is an
// empty config map: OpAMP's "no remote config", which is how a cleared
// desired config reaches the agent (the OpenTelemetry supervisor then
// stops its collector until a new config arrives).
func remoteConfig(d store.Desired) *protobufs.AgentRemoteConfig {
	h, _ := hex.DecodeString(d.Hash)
	files := map[string]*protobufs.AgentConfigFile{}
	if d.Body != "" {
		files[""] = &protobufs.AgentConfigFile{Body: []byte(d.Body), ContentType: "text/yaml"}
	}
	return &protobufs.AgentRemoteConfig{ConfigHash: h, Config: &protobufs.AgentConfigMap{ConfigMap: files}}
}

// afterFullState puts the desired config into resp, the response to the
// message with which a WebSocket agent told which config it runs, if it
// differs. Later changes arrive through Push (event bus) and Reconcile.
// The caller holds ac.mu.
func (c *configSender) afterFullState(ctx context.Context, ac *agentConn, uid string, resp *protobufs.ServerToAgent, now time.Time) {
	d, err := c.store.DesiredConfigs(ctx, []string{uid})
	if err != nil {
		c.log.Warn("loading a desired config failed; the reconcile will retry", "agent", uid, "error", err)
		return
	}
	if want, ok := d[uid]; ok && want.Hash != ac.seen.hash && want.Hash != ac.sentHash {
		resp.RemoteConfig = remoteConfig(want)
		ac.sentHash = want.Hash
		c.ev.add(uid, now, store.EventConfigSent, want.Hash)
	}
}

// forPoll puts the desired config into resp, the response to a plain-HTTP
// agent's poll, when it may have changed (ha.dirty) and differs from the
// one the agent reported, here or (the database's record) to another
// replica: behind a load balancer the agent's report of a config often
// reaches another replica than the poll that delivered it, and this
// replica's own view of the agent is then stale; going by it alone sent
// the revision again at the next poll that came here (11 of 200 agents
// received a rollout's revision twice in the scale run). It stays dirty
// until the agent reports it, and an event records the first send of
// each hash. The caller holds ha.mu.
func (c *configSender) forPoll(ctx context.Context, uid string, ha *httpAgent, resp *protobufs.ServerToAgent, now time.Time) {
	if !ha.dirty {
		return
	}
	d, err := c.store.DesiredConfigs(ctx, []string{uid})
	if err != nil {
		return
	}
	ha.dirty = false
	if want, ok := d[uid]; ok && want.Hash != ha.rep.hash && want.Hash != want.Reported {
		resp.RemoteConfig = remoteConfig(want)
		if want.Hash != ha.sentHash {
			c.ev.add(uid, now, store.EventConfigSent, want.Hash)
		}
		ha.sentHash = want.Hash
		ha.dirty = true // until the agent reports it
	}
}

// deliverTo reads the desired configs of the WebSocket agents uids
// (connected as acs) with one query and delivers them.
func (c *configSender) deliverTo(ctx context.Context, uids []string, acs map[string]*agentConn) error {
	d, err := c.store.DesiredConfigs(ctx, uids)
	if err != nil {
		return err
	}
	for _, uid := range uids {
		if want, ok := d[uid]; ok {
			c.deliver(ctx, acs[uid], want)
		}
	}
	return nil
}

// deliver sends want to the agent unless it has it or was sent it, or has
// not yet told which config it runs (then its full state does).
func (c *configSender) deliver(ctx context.Context, ac *agentConn, want store.Desired) {
	if want.Hash == "" {
		return
	}
	ac.mu.Lock()
	defer ac.mu.Unlock()
	if !ac.seen.known || want.Hash == ac.seen.hash || want.Hash == ac.sentHash {
		return
	}
	if err := ac.send(ctx, &protobufs.ServerToAgent{RemoteConfig: remoteConfig(want)}); err != nil {
		c.log.Warn("sending a remote config failed", "agent", ac.uid, "error", err)
		return
	}
	ac.sentHash = want.Hash
	c.ev.add(ac.uid, time.Now(), store.EventConfigSent, want.Hash)
}
