package opampserver

import (
	"context"
	"log/slog"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// Restart commands
//
// A restart request comes through the store like a config: the API
// records it (the agent must accept restart commands) and notifies
// store.RestartNotifyPrefix and the uid; the replica the agent is
// connected to claims it (store.RestartDelivered, once across replicas)
// and sends the command. A plain-HTTP agent gets it in the response to its
// next poll, a WebSocket agent at once; the reconcile picks up requests
// whose notification was lost.

// commander delivers the restart commands of the agents served here.
type commander struct {
	store *store.Store
	ev    events
	log   *slog.Logger
	reg   *registry
}

// push acts on the notification of a restart request for uid: a WebSocket
// agent here is sent the command, a plain-HTTP one looks on its next poll.
func (c *commander) push(ctx context.Context, uid string) {
	ac := c.reg.mark(uid, func(ha *httpAgent) { ha.cmdCheck = true })
	if ac == nil {
		return
	}
	p, err := c.store.PendingRestarts(ctx, []string{uid})
	if err != nil {
		c.log.Warn("loading a restart request failed; the reconcile will retry", "agent", uid, "error", err)
		return
	}
	if at, ok := p[uid]; ok {
		c.send(ctx, ac, at)
	}
}

// reconcile sends the pending restart requests of the WebSocket agents
// uids (connected as acs).
func (c *commander) reconcile(ctx context.Context, uids []string, acs map[string]*agentConn) error {
	p, err := c.store.PendingRestarts(ctx, uids)
	if err != nil {
		return err
	}
	for uid, at := range p {
		c.send(ctx, acs[uid], at)
	}
	return nil
}

// forPoll is the command for the response to a plain-HTTP agent's poll, or
// nil. It looks only when a restart may be pending (a notification, the
// reconcile, the agent's first poll here), until it finds none. A command
// travels alone: an agent ignores the other fields of a message that
// carries one. The caller holds ha.mu.
func (c *commander) forPoll(ctx context.Context, uid string, ha *httpAgent) *protobufs.ServerToAgentCommand {
	if !ha.cmdCheck {
		return nil
	}
	if cmd := c.take(ctx, uid, ha.rep.caps); cmd != nil {
		return cmd
	}
	ha.cmdCheck = false
	return nil
}

// take claims a pending restart request of uid and returns the command to
// send, or nil when there is none (or another replica took it).
func (c *commander) take(ctx context.Context, uid string, caps uint64) *protobufs.ServerToAgentCommand {
	p, err := c.store.PendingRestarts(ctx, []string{uid})
	if err != nil {
		c.log.Warn("loading a restart request failed; the reconcile will retry", "agent", uid, "error", err)
		return nil
	}
	at, ok := p[uid]
	if !ok {
		return nil
	}
	return c.claim(ctx, uid, at, caps)
}

// claim claims the restart request of uid made at at and returns the
// command to send, or nil when the agent does not accept one or another
// replica took it.
func (c *commander) claim(ctx context.Context, uid string, at time.Time, caps uint64) *protobufs.ServerToAgentCommand {
	if caps&uint64(protobufs.AgentCapabilities_AgentCapabilities_AcceptsRestartCommand) == 0 {
		// The API refuses such requests; one made before the agent
		// dropped the capability expires unsent.
		return nil
	}
	ok, err := c.store.RestartDelivered(ctx, uid, at)
	if err != nil || !ok {
		return nil
	}
	c.ev.add(uid, time.Now(), store.EventRestartSent, "")
	return &protobufs.ServerToAgentCommand{Type: protobufs.CommandType_CommandType_Restart}
}

// send sends the restart command requested at at to a WebSocket agent.
func (c *commander) send(ctx context.Context, ac *agentConn, at time.Time) {
	ac.mu.Lock()
	defer ac.mu.Unlock()
	cmd := c.claim(ctx, ac.uid, at, ac.seen.caps)
	if cmd == nil {
		return
	}
	if err := ac.send(ctx, &protobufs.ServerToAgent{Command: cmd}); err != nil {
		c.log.Warn("sending a restart command failed", "agent", ac.uid, "error", err)
	}
}
