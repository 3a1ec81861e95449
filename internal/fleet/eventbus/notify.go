package eventbus

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Channel is the LISTEN/NOTIFY channel of the changes that concern an
// agent; each payload is an Event.
const Channel = "myriarch_agent"

// Kind is what changed about an agent. It is the prefix of the payload,
// before the agent's instance uid.
type Kind string

// The kinds of event. A new desired config has no prefix: its payload is
// the bare instance uid.
const (
	DesiredConfig Kind = ""
	Restart       Kind = "restart:"
	Revoke        Kind = "revoke:"
	Rotate        Kind = "rotate:"
	Packages      Kind = "packages:"
)

// prefixed are the kinds with a prefix, in the order Parse tries them.
var prefixed = []Kind{Revoke, Rotate, Packages, Restart}

// Event is one change of one agent.
type Event struct {
	Kind Kind
	UID  string
}

// Payload is the NOTIFY payload of e.
func (e Event) Payload() string { return string(e.Kind) + e.UID }

// Parse reads a payload of Channel; a payload without a known prefix is a
// new desired config of the agent it names.
func Parse(payload string) Event {
	for _, k := range prefixed {
		if uid, ok := strings.CutPrefix(payload, string(k)); ok {
			return Event{k, uid}
		}
	}
	return Event{DesiredConfig, payload}
}

// Execer runs a statement: a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Notify announces an event of kind for each of uids on Channel. Inside a
// transaction the replicas get them at its commit, and not at all if it
// rolls back.
func Notify(ctx context.Context, q Execer, kind Kind, uids ...string) error {
	payloads := make([]string, len(uids))
	for i, u := range uids {
		payloads[i] = Event{kind, u}.Payload()
	}
	_, err := q.Exec(ctx, `SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p`, Channel, payloads)
	return err
}
