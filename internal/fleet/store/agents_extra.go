package store

import (
	"context"
	"encoding/json"
	"fmt"
	"math/bits"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/open-telemetry/opamp-go/protobufs"

	"github.com/myriarch/myriarch/internal/fleet/eventbus"
)

// Event kinds of agent commands.
const (
	EventRestartRequested = "restart_requested"
	EventRestartSent      = "restart_sent"
)

// RestartNotifyPrefix starts the NOTIFY payload (on NotifyChannel) of a
// restart request; the rest is the instance uid (eventbus.Restart).
const RestartNotifyPrefix = string(eventbus.Restart)

// RestartRequestTTL is how long a restart request waits for its delivery:
// an agent that reconnects later is not restarted by a stale request.
const RestartRequestTTL = 2 * time.Minute

// CapabilityNames names the OpAMP agent capability bits set in caps
// ("ReportsStatus", "AcceptsRemoteConfig", ...), lowest bit first; a bit
// that the OpAMP protocol does not define is named by its value.
func CapabilityNames(caps uint64) []string {
	names := []string{}
	for caps != 0 {
		bit := uint64(1) << bits.TrailingZeros64(caps)
		caps &^= bit
		if n, ok := protobufs.AgentCapabilities_name[int32(bit)]; ok && bit <= 1<<30 {
			names = append(names, strings.TrimPrefix(n, "AgentCapabilities_"))
		} else {
			names = append(names, fmt.Sprintf("0x%x", bit))
		}
	}
	return names
}

// MarshalJSON adds capability_names to the stored fields, so that the API
// shows capabilities by name next to the raw bit set, and a bridge's
// bridge_id and session roles ("" and [] for other agents). A struct that
// embeds Agent anonymously inherits this method and marshals as an Agent
// alone: give the field a name.
func (a Agent) MarshalJSON() ([]byte, error) {
	type plain Agent
	roles := a.Roles()
	if roles == nil {
		roles = []string{}
	}
	return json.Marshal(struct {
		plain
		CapabilityNames []string `json:"capability_names"`
		BridgeID        string   `json:"bridge_id"`
		Roles           []string `json:"roles"`
	}{plain(a), CapabilityNames(a.Capabilities), a.BridgeID(), roles})
}

// ConnectedHTTP is Connected for a plain-HTTP agent (connection id
// connID): it also tells whether the agent was not online over plain HTTP
// before (new, offline, or on a WebSocket), which makes the poll a connect.
func (s *Store) ConnectedHTTP(ctx context.Context, uid, replica, connID string, at time.Time) (connect bool, err error) {
	var created bool
	var prevStatus, prevConn *string
	err = s.Pool.QueryRow(ctx, `
		WITH prev AS (SELECT status, connection_id FROM agents WHERE instance_uid = $1)
		INSERT INTO agents (instance_uid, status, replica_id, connection_id, first_seen, last_seen)
		VALUES ($1, 'online', $2, $3, $4, $4)
		ON CONFLICT (instance_uid) DO UPDATE SET status = 'online', replica_id = $2, connection_id = $3,
			last_seen = greatest(agents.last_seen, $4)
		RETURNING (xmax = 0), (SELECT status FROM prev), (SELECT connection_id FROM prev)`, uid, replica, connID, at).
		Scan(&created, &prevStatus, &prevConn)
	if err != nil {
		return false, err
	}
	return created || prevStatus == nil || *prevStatus != "online" || prevConn == nil || *prevConn != connID, nil
}

// RequestRestart records a restart request for agent uid and notifies
// every replica in the same transaction. It fails with ErrNotFound for an
// unknown agent.
func (s *Store) RequestRestart(ctx context.Context, uid string) (Agent, error) {
	var a Agent
	err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		var err error
		a, err = scanAgent(tx.QueryRow(ctx, `UPDATE agents SET restart_requested_at = now() WHERE instance_uid = $1
			RETURNING `+agentCols, uid))
		if err == pgx.ErrNoRows {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO agent_events (instance_uid, at, kind, detail) VALUES ($1, now(), $2, '')`,
			uid, EventRestartRequested); err != nil {
			return err
		}
		return eventbus.Notify(ctx, tx, eventbus.Restart, uid)
	})
	return a, err
}

// PendingRestarts returns, of the given agents, those with a restart
// request younger than RestartRequestTTL, with the request's time.
func (s *Store) PendingRestarts(ctx context.Context, uids []string) (map[string]time.Time, error) {
	rows, err := s.Pool.Query(ctx, `SELECT instance_uid, restart_requested_at FROM agents
		WHERE instance_uid = ANY($1) AND restart_requested_at > now() - make_interval(secs => $2)`, uids, RestartRequestTTL.Seconds())
	if err != nil {
		return nil, err
	}
	out := map[string]time.Time{}
	var uid string
	var at time.Time
	_, err = pgx.ForEachRow(rows, []any{&uid, &at}, func() error {
		out[uid] = at
		return nil
	})
	return out, err
}

// RestartDelivered clears the restart request of uid made at at; it
// returns false when that request was already taken (by another replica,
// or replaced by a newer one), and then the command must not be sent.
func (s *Store) RestartDelivered(ctx context.Context, uid string, at time.Time) (bool, error) {
	tag, err := s.Pool.Exec(ctx, `UPDATE agents SET restart_requested_at = NULL
		WHERE instance_uid = $1 AND restart_requested_at = $2`, uid, at)
	return tag.RowsAffected() == 1, err
}
