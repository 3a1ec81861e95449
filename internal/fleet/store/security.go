package store

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Role is what an API token may do. Each role includes the ones below it.
type Role string

// The roles, weakest first.
const (
	// RoleViewer reads: agents, events, cluster, overview.
	RoleViewer Role = "viewer"
	// RoleOperator also changes what agents run: configurations,
	// rollouts, agent commands (restart, clear or push a config).
	RoleOperator Role = "operator"
	// RoleAdmin also manages access: API tokens, agents' credentials
	// (rotation, revocation).
	RoleAdmin Role = "admin"
)

// Roles lists the roles, weakest first.
var Roles = []Role{RoleViewer, RoleOperator, RoleAdmin}

func (r Role) rank() int {
	for i, x := range Roles {
		if x == r {
			return i
		}
	}
	return -1
}

// Allows reports whether a token of role r may do what needs role need.
func (r Role) Allows(need Role) bool { return r.rank() >= 0 && r.rank() >= need.rank() }

// ParseRole checks a role name.
func ParseRole(s string) (Role, error) {
	r := Role(s)
	if r.rank() < 0 {
		return "", fmt.Errorf("role %q: must be one of viewer, operator, admin", s)
	}
	return r, nil
}

// SessionPrefix starts every UI session id.
const SessionPrefix = "mys_"

// CreateSession opens a UI session for the token with id tokenID, valid
// for ttl, and returns its id (the cookie value); only its hash is stored.
func (s *Store) CreateSession(ctx context.Context, tokenID int64, ttl time.Duration) (string, error) {
	id, err := randomSecret(SessionPrefix)
	if err != nil {
		return "", err
	}
	// Expired sessions go on the way, so the table holds only live ones
	// (and the ones of the last login's lifetime).
	_, err = s.Pool.Exec(ctx, `WITH gone AS (DELETE FROM ui_sessions WHERE expires_at < now())
		INSERT INTO ui_sessions (hash, token_id, expires_at) VALUES ($1, $2, now() + $3::interval)`,
		hashToken(id), tokenID, fmt.Sprintf("%d microseconds", ttl.Microseconds()))
	return id, err
}

// CheckSession returns the token of a valid session: not expired, and its
// token not revoked (revoking a token ends its sessions at once).
func (s *Store) CheckSession(ctx context.Context, id string) (Token, bool, error) {
	if !strings.HasPrefix(id, SessionPrefix) {
		return Token{}, false, nil
	}
	return queryOne[Token](ctx, s.Pool, `SELECT t.id, t.name, t.created_at, t.last_used_at, t.revoked_at, t.revoked_by, t.role
		FROM ui_sessions s JOIN api_tokens t ON t.id = s.token_id
		WHERE s.hash = $1 AND s.expires_at > now() AND t.revoked_at IS NULL`, hashToken(id))
}

// DeleteSession ends a session (logout) and, on the way, expired ones.
func (s *Store) DeleteSession(ctx context.Context, id string) error {
	_, err := s.Pool.Exec(ctx, `DELETE FROM ui_sessions WHERE hash = $1 OR expires_at < now()`, hashToken(id))
	return err
}

// queryOne runs a query that returns at most one row, read into a T by
// column position: ok is false, with no error, when it returns none.
func queryOne[T any](ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, sql string, args ...any) (T, bool, error) {
	var zero T
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return zero, false, err
	}
	t, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[T])
	if errors.Is(err, pgx.ErrNoRows) {
		return zero, false, nil
	}
	return t, err == nil, err
}

func randomSecret(prefix string) (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// CredentialPrefix starts every agent credential.
const CredentialPrefix = "mya_"

// RevokeNotifyPrefix and RotateNotifyPrefix, followed by an instance
// UID, are notifications on NotifyChannel: the replica the agent is
// connected to disconnects it, or hands it a new credential.
const (
	RevokeNotifyPrefix = "revoke:"
	RotateNotifyPrefix = "rotate:"
)

// ErrRevoked is returned for an agent whose credential was revoked.
var ErrRevoked = errors.New("agent revoked")

// AgentCredential is the stored state of an agent's credential.
type AgentCredential struct {
	InstanceUID string     `json:"instance_uid"`
	Issued      bool       `json:"issued"`
	CreatedAt   time.Time  `json:"created_at"`
	RotatedAt   *time.Time `json:"rotated_at"`
	RevokedAt   *time.Time `json:"revoked_at"`
	RevokedBy   string     `json:"revoked_by"`
	// ReenrollAllowedAt is set while an admin's allowance to enroll
	// this UID again with the secret is unused (AllowReenroll).
	ReenrollAllowedAt *time.Time `json:"reenroll_allowed_at"`
	ReenrollAllowedBy string     `json:"reenroll_allowed_by"`
}

const credCols = "instance_uid, hash IS NOT NULL, created_at, rotated_at, revoked_at, revoked_by, reenroll_allowed_at, reenroll_allowed_by"

// IssueAgentCredential gives agent uid a new credential, replacing any
// earlier one, and returns it; only its hash is stored. A revoked agent
// gets ErrRevoked.
func (s *Store) IssueAgentCredential(ctx context.Context, uid string) (string, error) {
	cred, err := randomSecret(CredentialPrefix)
	if err != nil {
		return "", err
	}
	tag, err := s.Pool.Exec(ctx, `INSERT INTO agent_credentials (instance_uid, hash) VALUES ($1, $2)
		ON CONFLICT (instance_uid) DO UPDATE SET hash = EXCLUDED.hash, rotated_at = now(), rotate_requested_at = NULL
		WHERE agent_credentials.revoked_at IS NULL`, uid, hashToken(cred))
	if err != nil {
		return "", err
	}
	if tag.RowsAffected() == 0 {
		return "", ErrRevoked
	}
	return cred, nil
}

// ErrCredentialHeld is returned when the enrollment secret asks for a
// credential of an instance UID that holds one and has no re-enrollment
// allowance.
var ErrCredentialHeld = errors.New("the instance UID holds a credential")

// Agent credential events (agent_events.kind): every issue, rotation and
// refusal of an agent's identity, and an admin's re-enrollment allowance.
const (
	EventCredentialIssued  = "credential_issued"
	EventCredentialRotated = "credential_rotated"
	EventEnrollRefused     = "enrollment_refused"
	EventReenrollAllowed   = "reenroll_allowed"
	// EventReportRefused: an agent's message over a report limit.
	EventReportRefused = "report_refused"
)

// EnrollAgentCredential is the credential issue of an enrollment with the
// secret: it gives uid its first credential, or a new one when an admin
// allowed re-enrollment (the allowance is used up). It never replaces a
// credential otherwise (ErrCredentialHeld), so the secret cannot take over
// an enrolled agent; a revoked agent gets ErrRevoked. One statement, so
// two replicas enrolling one UID at once issue one credential.
func (s *Store) EnrollAgentCredential(ctx context.Context, uid string) (cred string, reenrolled bool, err error) {
	cred, err = randomSecret(CredentialPrefix)
	if err != nil {
		return "", false, err
	}
	rows, err := s.Pool.Query(ctx, `INSERT INTO agent_credentials (instance_uid, hash) VALUES ($1, $2)
		ON CONFLICT (instance_uid) DO UPDATE SET hash = EXCLUDED.hash, rotated_at = now(), rotate_requested_at = NULL,
			reenroll_allowed_at = NULL, reenroll_allowed_by = ''
		WHERE agent_credentials.revoked_at IS NULL
			AND (agent_credentials.hash IS NULL OR agent_credentials.reenroll_allowed_at IS NOT NULL)
		RETURNING (xmax <> 0)`, uid, hashToken(cred))
	if err != nil {
		return "", false, err
	}
	updated, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	if errors.Is(err, pgx.ErrNoRows) {
		c, _, err := s.AgentCredentialOf(ctx, uid)
		if err != nil {
			return "", false, err
		}
		if c.RevokedAt != nil {
			return "", false, ErrRevoked
		}
		return "", false, ErrCredentialHeld
	}
	if err != nil {
		return "", false, err
	}
	return cred, updated, nil
}

// AllowReenroll lets agent uid enroll once more with the enrollment secret
// although it holds a credential (the agent lost its credential, or was
// reinstalled with its old UID) or was revoked (an admin brings it back:
// the revocation is lifted for that one enrollment, the old credential
// stays void because revoking deleted it). by is recorded; the revocation
// and the allowance stay in the agent's events. ErrNotFound when uid has
// neither a credential nor a revocation (the secret enrolls it anyway).
func (s *Store) AllowReenroll(ctx context.Context, uid, by string) (AgentCredential, error) {
	rows, err := s.Pool.Query(ctx, `UPDATE agent_credentials SET reenroll_allowed_at = now(), reenroll_allowed_by = $2,
			revoked_at = NULL, revoked_by = ''
		WHERE instance_uid = $1 AND (hash IS NOT NULL OR revoked_at IS NOT NULL) RETURNING `+credCols, uid, by)
	if err != nil {
		return AgentCredential{}, err
	}
	c, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[AgentCredential])
	if errors.Is(err, pgx.ErrNoRows) {
		return AgentCredential{}, ErrNotFound
	}
	return c, err
}

// CheckAgentCredential returns the instance UID that credential cred is
// bound to, or ok false for an unknown or revoked one.
func (s *Store) CheckAgentCredential(ctx context.Context, cred string) (uid string, ok bool, err error) {
	if !strings.HasPrefix(cred, CredentialPrefix) {
		return "", false, nil
	}
	err = s.Pool.QueryRow(ctx, `SELECT instance_uid FROM agent_credentials WHERE hash = $1 AND revoked_at IS NULL`, hashToken(cred)).Scan(&uid)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	return uid, err == nil, err
}

// AgentCredentialOf returns the credential state of uid; ok false when it
// never had one and was never revoked.
func (s *Store) AgentCredentialOf(ctx context.Context, uid string) (AgentCredential, bool, error) {
	return queryOne[AgentCredential](ctx, s.Pool, "SELECT "+credCols+" FROM agent_credentials WHERE instance_uid = $1", uid)
}

// RevokeAgent revokes agent uid: its credential stops working, it cannot
// enroll again, it is marked offline (with an event), and the replica it
// is connected to disconnects it at once (notification). by is recorded.
// An unknown agent is ErrNotFound.
func (s *Store) RevokeAgent(ctx context.Context, uid, by string) (AgentCredential, error) {
	tx, err := s.Pool.Begin(ctx)
	if err != nil {
		return AgentCredential{}, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM agents WHERE instance_uid = $1)
		OR EXISTS (SELECT 1 FROM agent_credentials WHERE instance_uid = $1)`, uid).Scan(&exists); err != nil {
		return AgentCredential{}, err
	}
	if !exists {
		return AgentCredential{}, ErrNotFound
	}
	rows, err := tx.Query(ctx, `INSERT INTO agent_credentials (instance_uid, revoked_at, revoked_by) VALUES ($1, now(), $2)
		ON CONFLICT (instance_uid) DO UPDATE SET hash = NULL,
			revoked_at = COALESCE(agent_credentials.revoked_at, now()),
			revoked_by = CASE WHEN agent_credentials.revoked_at IS NULL THEN $2 ELSE agent_credentials.revoked_by END
		RETURNING `+credCols, uid, by)
	if err != nil {
		return AgentCredential{}, err
	}
	c, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[AgentCredential])
	if err != nil {
		return AgentCredential{}, err
	}
	// A revoked agent is offline from now on: a WebSocket agent's
	// connection is closed on the replica that holds it, but a plain-HTTP
	// agent has no connection to close, and it would have stayed
	// "online" until the offline sweep. last_seen moves to now so that a
	// last-seen flush of a poll from before the revocation (FlushSeen
	// updates only rows seen earlier) cannot mark it online again.
	if _, err := tx.Exec(ctx, `WITH off AS (
			UPDATE agents SET status = 'offline', last_seen = greatest(last_seen, now())
			WHERE instance_uid = $1 AND status = 'online' RETURNING instance_uid, replica_id)
		INSERT INTO agent_events (instance_uid, at, kind, replica_id, detail)
		SELECT instance_uid, now(), 'marked_offline', replica_id, 'credential revoked' FROM off`, uid); err != nil {
		return AgentCredential{}, err
	}
	if _, err := tx.Exec(ctx, "SELECT pg_notify($1, $2)", NotifyChannel, RevokeNotifyPrefix+uid); err != nil {
		return AgentCredential{}, err
	}
	return c, tx.Commit(ctx)
}

// RequestCredentialRotation asks the replica agent uid is connected to for
// a new credential (sent as OpAMP connection settings; the old one stops
// working once the new one is stored). ErrNotFound when uid has no
// credential, ErrRevoked when it was revoked.
func (s *Store) RequestCredentialRotation(ctx context.Context, uid string) error {
	c, ok, err := s.AgentCredentialOf(ctx, uid)
	switch {
	case err != nil:
		return err
	case !ok || !c.Issued && c.RevokedAt == nil:
		return ErrNotFound
	case c.RevokedAt != nil:
		return ErrRevoked
	}
	tx, err := s.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
	if _, err := tx.Exec(ctx, `UPDATE agent_credentials SET rotate_requested_at = now() WHERE instance_uid = $1`, uid); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "SELECT pg_notify($1, $2)", NotifyChannel, RotateNotifyPrefix+uid); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// PendingRotations returns which of uids have a rotation request.
func (s *Store) PendingRotations(ctx context.Context, uids []string) (map[string]bool, error) {
	return s.credentialsWhere(ctx, "rotate_requested_at IS NOT NULL AND revoked_at IS NULL", uids)
}

// RevokedAmong returns which of uids are revoked.
func (s *Store) RevokedAmong(ctx context.Context, uids []string) (map[string]bool, error) {
	return s.credentialsWhere(ctx, "revoked_at IS NOT NULL", uids)
}

// credentialsWhere returns which of uids have a credential row for which
// cond holds.
func (s *Store) credentialsWhere(ctx context.Context, cond string, uids []string) (map[string]bool, error) {
	rows, err := s.Pool.Query(ctx, `SELECT instance_uid FROM agent_credentials
		WHERE instance_uid = ANY($1) AND `+cond, uids)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	var uid string
	_, err = pgx.ForEachRow(rows, []any{&uid}, func() error { out[uid] = true; return nil })
	return out, err
}

// ConnectedElsewhere returns the replica agent uid is connected to over a
// lasting connection (its connection id is not httpConnID), when it is
// online and was seen within fresh; ok false otherwise. A plain-HTTP poll
// with the agent's credential is then a second transport for one UID.
func (s *Store) ConnectedElsewhere(ctx context.Context, uid, httpConnID string, fresh time.Duration) (replica string, ok bool, err error) {
	err = s.Pool.QueryRow(ctx, `SELECT replica_id FROM agents WHERE instance_uid = $1 AND status = 'online'
		AND connection_id <> $2 AND connection_id <> '' AND last_seen > now() - $3::interval`,
		uid, httpConnID, fmt.Sprintf("%d microseconds", fresh.Microseconds())).Scan(&replica)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	return replica, err == nil, err
}
