// Package store is myriarchd's PostgreSQL state: agents, their events, API
// tokens and job runs. Replicas share state through it only.
//
// The schema is migrated with goose from SQL files embedded in the binary.
// Migrations run under a PostgreSQL session advisory lock, so replicas that
// start at the same time migrate once, one after the other.
package store

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/myriarch/myriarch/internal/fleet/eventbus"
	"github.com/myriarch/myriarch/pgleader"
)

//go:embed migrations/*.sql
var migrations embed.FS

// MigrationLockID is the advisory lock that serializes migrations
// (distinct from ha.leaderLockKey's default).
const MigrationLockID int64 = 7012025

// NotifyChannel is the LISTEN/NOTIFY channel of agent changes
// (eventbus.Channel; its payloads are eventbus.Events).
const NotifyChannel = eventbus.Channel

// ErrNotFound is returned for an unknown agent.
var ErrNotFound = errors.New("not found")

// Store is the database of one replica.
type Store struct {
	Pool *pgxpool.Pool
	log  *slog.Logger
}

// Open connects a pool to url and migrates the schema.
func Open(ctx context.Context, url string, maxConns int32, log *slog.Logger) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database.url: %w", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	s := &Store{Pool: pool, log: log}
	if err := s.Migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the pool.
func (s *Store) Close() { s.Pool.Close() }

// Migrate applies pending migrations under the migration advisory lock.
func (s *Store) Migrate(ctx context.Context) error {
	db := stdlib.OpenDBFromPool(s.Pool)
	defer db.Close()
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(MigrationLockID), lock.WithLockTimeout(1, 600))
	if err != nil {
		return err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, mustSub(migrations, "migrations"),
		goose.WithSessionLocker(locker), goose.WithTableName("myriarch_schema_version"), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return err
	}
	res, err := p.Up(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	for _, r := range res {
		s.log.Info("applied migration", "version", r.Source.Version, "duration", r.Duration)
	}
	return nil
}

// Agent is one agent as stored.
type Agent struct {
	InstanceUID        string            `json:"instance_uid"`
	Identifying        map[string]string `json:"identifying_attributes"`
	NonIdentifying     map[string]string `json:"non_identifying_attributes"`
	Healthy            *bool             `json:"healthy"`
	Health             json.RawMessage   `json:"health,omitempty"`
	EffectiveConfig    string            `json:"effective_config"`
	RemoteConfigStatus string            `json:"remote_config_status"`
	RemoteConfigHash   string            `json:"remote_config_hash"`
	RemoteConfigError  string            `json:"remote_config_error"`
	PackageStatuses    json.RawMessage   `json:"package_statuses,omitempty"`
	Capabilities       uint64            `json:"capabilities"`
	Status             string            `json:"status"`
	ReplicaID          string            `json:"replica_id"`
	FirstSeen          time.Time         `json:"first_seen"`
	LastSeen           time.Time         `json:"last_seen"`
	DesiredConfig      string            `json:"desired_config"`
	DesiredConfigHash  string            `json:"desired_config_hash"`
	// DesiredSource is where the desired config came from (nil: none).
	DesiredSource *DesiredSource `json:"desired_source"`
}

const agentCols = `instance_uid, identifying, non_identifying, healthy, health, effective_config, remote_config_status,
	remote_config_hash, remote_config_error, package_statuses, capabilities, status, replica_id, first_seen, last_seen,
	desired_config, desired_config_hash, desired_source, desired_config_name, desired_revision, desired_rollout_id, desired_by,
	desired_config_at`

func scanAgent(r pgx.Row) (Agent, error) {
	var a Agent
	var caps int64
	var src DesiredSource
	var at *time.Time
	err := r.Scan(&a.InstanceUID, &a.Identifying, &a.NonIdentifying, &a.Healthy, &a.Health, &a.EffectiveConfig,
		&a.RemoteConfigStatus, &a.RemoteConfigHash, &a.RemoteConfigError, &a.PackageStatuses, &caps, &a.Status,
		&a.ReplicaID, &a.FirstSeen, &a.LastSeen, &a.DesiredConfig, &a.DesiredConfigHash,
		&src.Kind, &src.Config, &src.Revision, &src.RolloutID, &src.By, &at)
	a.Capabilities = uint64(caps)
	if src.Kind != "" {
		if at != nil {
			src.At = *at
		}
		a.DesiredSource = &src
	}
	return a, err
}

// Connected records that an agent connected to this replica on connection
// connID at time at; it creates the agent when it is new.
func (s *Store) Connected(ctx context.Context, uid, replica, connID string, at time.Time) (created bool, err error) {
	err = s.Pool.QueryRow(ctx, `
		INSERT INTO agents (instance_uid, status, replica_id, connection_id, first_seen, last_seen)
		VALUES ($1, 'online', $2, $3, $4, $4)
		ON CONFLICT (instance_uid) DO UPDATE SET status = 'online', replica_id = $2, connection_id = $3, last_seen = $4
		RETURNING (xmax = 0)`, uid, replica, connID, at).Scan(&created)
	return created, err
}

// State is a partial update of an agent's reported state; nil fields are
// left as they are.
type State struct {
	Identifying        map[string]string
	NonIdentifying     map[string]string
	Healthy            *bool
	Health             any
	EffectiveConfig    *string
	RemoteConfigStatus *string
	RemoteConfigHash   *string
	RemoteConfigError  *string
	PackageStatuses    any
	Capabilities       *uint64
}

// UpdateState applies a partial state update of agent uid, as long as
// connection connID is still its current connection.
func (s *Store) UpdateState(ctx context.Context, uid, connID string, st State) error {
	var sets []string
	args := []any{uid, connID}
	add := func(col string, v any) {
		args = append(args, v)
		sets = append(sets, fmt.Sprintf("%s = $%d", col, len(args)))
	}
	if st.Identifying != nil || st.NonIdentifying != nil {
		if st.Identifying == nil {
			st.Identifying = map[string]string{}
		}
		if st.NonIdentifying == nil {
			st.NonIdentifying = map[string]string{}
		}
		attrs := maps.Clone(st.NonIdentifying)
		maps.Copy(attrs, st.Identifying)
		add("identifying", st.Identifying)
		add("non_identifying", st.NonIdentifying)
		add("attrs", attrs)
	}
	if st.Healthy != nil {
		add("healthy", *st.Healthy)
	}
	if st.Health != nil {
		add("health", st.Health)
	}
	if st.EffectiveConfig != nil {
		add("effective_config", *st.EffectiveConfig)
	}
	if st.RemoteConfigStatus != nil {
		add("remote_config_status", *st.RemoteConfigStatus)
	}
	if st.RemoteConfigHash != nil {
		add("remote_config_hash", *st.RemoteConfigHash)
	}
	if st.RemoteConfigError != nil {
		add("remote_config_error", *st.RemoteConfigError)
	}
	if st.PackageStatuses != nil {
		add("package_statuses", st.PackageStatuses)
	}
	if st.Capabilities != nil {
		add("capabilities", int64(*st.Capabilities))
	}
	if len(sets) == 0 {
		return nil
	}
	_, err := s.Pool.Exec(ctx, "UPDATE agents SET "+strings.Join(sets, ", ")+" WHERE instance_uid = $1 AND connection_id = $2", args...)
	return err
}

// Seen is one last-seen time of an agent on a connection.
type Seen struct {
	UID, ConnID string
	At          time.Time
	// Replica, when not empty, is recorded as the agent's replica with the
	// time: a plain-HTTP agent (one connection id for all its polls) whose
	// polls a load balancer spreads over the replicas is on the replica
	// that answered it last, not on one that has died since.
	Replica string
}

// FlushSeen writes a batch of last-seen times in one statement. A time is
// only written while its connection is the agent's current one and only
// moves forward.
func (s *Store) FlushSeen(ctx context.Context, batch []Seen) (int64, error) {
	if len(batch) == 0 {
		return 0, nil
	}
	uids := make([]string, len(batch))
	conns := make([]string, len(batch))
	ats := make([]time.Time, len(batch))
	reps := make([]string, len(batch))
	for i, b := range batch {
		uids[i], conns[i], ats[i], reps[i] = b.UID, b.ConnID, b.At, b.Replica
	}
	tag, err := s.Pool.Exec(ctx, flushSeenSQL, uids, conns, ats, reps)
	return tag.RowsAffected(), err
}

// flushSeenSQL is FlushSeen's statement. It changes no indexed column
// unless a plain-HTTP agent moved replicas, so its updates are HOT (00070).
const flushSeenSQL = `
	UPDATE agents a SET last_seen = v.at, status = 'online', replica_id = CASE WHEN v.rep = '' THEN a.replica_id ELSE v.rep END
	FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[]) AS v(uid, conn, at, rep)
	WHERE a.instance_uid = v.uid AND a.connection_id = v.conn AND a.last_seen < v.at`

// Event is one entry of an agent's event log.
type Event struct {
	ID          int64     `json:"id"`
	InstanceUID string    `json:"instance_uid"`
	At          time.Time `json:"at"`
	Kind        string    `json:"kind"`
	ReplicaID   string    `json:"replica_id"`
	Detail      string    `json:"detail"`
}

// Event kinds.
const (
	EventConnected      = "connected"
	EventDisconnected   = "disconnected"
	EventHealthChanged  = "health_changed"
	EventConfigApplied  = "config_applied"
	EventConfigFailed   = "config_failed"
	EventConfigApplying = "config_applying"
	EventConfigSent     = "config_sent"
	EventMarkedOffline  = "marked_offline"
)

// InsertEvents writes events in one COPY.
func (s *Store) InsertEvents(ctx context.Context, evs []Event) error {
	if len(evs) == 0 {
		return nil
	}
	_, err := s.Pool.CopyFrom(ctx, pgx.Identifier{"agent_events"}, []string{"instance_uid", "at", "kind", "replica_id", "detail"},
		pgx.CopyFromSlice(len(evs), func(i int) ([]any, error) {
			e := evs[i]
			return []any{e.InstanceUID, e.At, e.Kind, e.ReplicaID, e.Detail}, nil
		}))
	return err
}

// Disconnected marks agent uid offline if connID is still its connection.
func (s *Store) Disconnected(ctx context.Context, uid, connID string, at time.Time) (bool, error) {
	tag, err := s.Pool.Exec(ctx, `UPDATE agents SET status = 'offline', last_seen = greatest(last_seen, $3)
		WHERE instance_uid = $1 AND connection_id = $2 AND status = 'online'`, uid, connID, at)
	return tag.RowsAffected() == 1, err
}

// MarkProcessOffline marks offline every agent whose current connection
// belongs to the process whose connection ids start with prefix; it
// returns their uids.
func (s *Store) MarkProcessOffline(ctx context.Context, prefix string) ([]string, error) {
	rows, err := s.Pool.Query(ctx, `UPDATE agents SET status = 'offline'
		WHERE status = 'online' AND starts_with(connection_id, $1) RETURNING instance_uid`, prefix)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Filter selects agents.
type Filter struct {
	Status  string
	Replica string
	// Selector is a label selector on the attributes: key=value pairs that
	// must all match.
	Selector map[string]string
	// BridgeID keeps the bridges that report this bridge id (the two
	// processes of a pair); Role those that report a session in this role
	// (one of SessionRoles). Both are evaluated in SQL, with an index each.
	BridgeID string
	Role     string
	// After is the paging cursor: the last instance uid of the previous page.
	After string
	Limit int
}

// ParseSelector parses "k=v,k2=v2".
func ParseSelector(s string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for part := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(part, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("selector %q: each term must be key=value", part)
		}
		out[k] = strings.TrimSpace(v)
	}
	return out, nil
}

// ListAgents returns a page of agents ordered by instance uid and the
// cursor of the next page ("" at the end).
func (s *Store) ListAgents(ctx context.Context, f Filter) ([]Agent, string, error) {
	if f.Limit <= 0 || f.Limit > 1000 {
		f.Limit = 100
	}
	where := []string{"instance_uid > $1"}
	args := []any{f.After}
	if f.Status != "" {
		args = append(args, f.Status)
		where = append(where, fmt.Sprintf("status = $%d", len(args)))
	}
	if f.Replica != "" {
		args = append(args, f.Replica)
		where = append(where, fmt.Sprintf("replica_id = $%d", len(args)))
	}
	if len(f.Selector) > 0 {
		args = append(args, f.Selector)
		where = append(where, fmt.Sprintf("attrs @> $%d", len(args)))
	}
	if f.BridgeID != "" {
		args = append(args, f.BridgeID)
		where = append(where, fmt.Sprintf("%s = $%d", BridgeIDSQL, len(args)))
	}
	if f.Role != "" {
		if !IsSessionRole(f.Role) {
			return nil, "", fmt.Errorf("role: %q: must be one of %s", f.Role, strings.Join(SessionRoles, ", "))
		}
		// A constant, so that the planner uses the role's partial index
		// (migration 00067) also with a cached statement.
		where = append(where, SessionRoleSQL(f.Role))
	}
	args = append(args, f.Limit+1)
	rows, err := s.Pool.Query(ctx, "SELECT "+agentCols+" FROM agents WHERE "+strings.Join(where, " AND ")+
		fmt.Sprintf(" ORDER BY instance_uid LIMIT $%d", len(args)), args...)
	if err != nil {
		return nil, "", err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Agent, error) { return scanAgent(r) })
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > f.Limit {
		out = out[:f.Limit]
		next = out[len(out)-1].InstanceUID
	}
	return out, next, nil
}

// GetAgent returns one agent.
func (s *Store) GetAgent(ctx context.Context, uid string) (Agent, error) {
	a, err := scanAgent(s.Pool.QueryRow(ctx, "SELECT "+agentCols+" FROM agents WHERE instance_uid = $1", uid))
	if errors.Is(err, pgx.ErrNoRows) {
		return a, ErrNotFound
	}
	return a, err
}

// Events returns the newest events of an agent, newest first.
func (s *Store) Events(ctx context.Context, uid string, limit int) ([]Event, error) {
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	rows, err := s.Pool.Query(ctx, `SELECT id, instance_uid, at, kind, replica_id, detail FROM agent_events
		WHERE instance_uid = $1 ORDER BY id DESC LIMIT $2`, uid, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Event])
}

// Counts is the fleet overview.
type Counts struct {
	Total     int64 `json:"total"`
	Online    int64 `json:"online"`
	Offline   int64 `json:"offline"`
	Unhealthy int64 `json:"unhealthy"`
}

// Counts counts agents by status.
func (s *Store) Counts(ctx context.Context) (Counts, error) {
	var c Counts
	err := s.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'online'),
		count(*) FILTER (WHERE status = 'offline'), count(*) FILTER (WHERE status = 'online' AND healthy = false) FROM agents`).
		Scan(&c.Total, &c.Online, &c.Offline, &c.Unhealthy)
	return c, err
}

// ConfigHash is the hash under which a remote config is delivered.
func ConfigHash(body string) string {
	h := sha256.Sum256([]byte(body))
	return hex.EncodeToString(h[:])
}

// SetDesiredConfig stores the remote config of an agent and notifies every
// replica in the same transaction; it records no author
// (SetDesiredConfigBy).
func (s *Store) SetDesiredConfig(ctx context.Context, uid, body string) (string, error) {
	return s.SetDesiredConfigBy(ctx, uid, body, "")
}

// SetDesiredConfigBy is SetDesiredConfig recording by (who pushed it,
// "token NAME" for the API) as the author of a direct push. An empty body
// clears the desired config: the agent then has no DesiredSource.
func (s *Store) SetDesiredConfigBy(ctx context.Context, uid, body, by string) (string, error) {
	hash := ConfigHash(body)
	src := desiredWrite{kind: DesiredDirect, by: by}
	if body == "" {
		src.kind = ""
	}
	err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		n, err := writeDesired(ctx, tx, []string{uid}, body, hash, src)
		if err == nil && n == 0 {
			return ErrNotFound // and the rollback takes back the notification
		}
		return err
	})
	return hash, err
}

// Desired is an agent's desired remote config.
type Desired struct {
	Body, Hash string
	// Reported is the hash of the remote config the agent last reported
	// (applying, applied or failed), whichever replica it reported to.
	Reported string
}

// DesiredConfigs returns the desired configs of the given agents that have one.
func (s *Store) DesiredConfigs(ctx context.Context, uids []string) (map[string]Desired, error) {
	rows, err := s.Pool.Query(ctx, `SELECT instance_uid, desired_config, desired_config_hash, remote_config_hash FROM agents
		WHERE instance_uid = ANY($1) AND desired_config_hash <> ''`, uids)
	return byUID(rows, err, func(d *Desired) []any { return []any{&d.Body, &d.Hash, &d.Reported} })
}

// byUID reads rows of (instance_uid, the fields of a T) into a map by uid
// (err: the query's). Each row is scanned into a fresh T, so that nothing
// a row scanned into a pointer or a map is shared with the next.
func byUID[T any](rows pgx.Rows, err error, fields func(*T) []any) (map[string]T, error) {
	if err != nil {
		return nil, err
	}
	m := map[string]T{}
	var uid string
	var r T
	_, err = pgx.ForEachRow(rows, append([]any{&uid}, fields(&r)...), func() error {
		m[uid] = r
		var zero T
		r = zero
		return nil
	})
	return m, err
}

// TokenPrefix starts every API token.
const TokenPrefix = "myr_"

func hashToken(tok string) []byte {
	h := sha256.Sum256([]byte(tok))
	return h[:]
}

// Token is an API token as listed: never the token itself, which only its
// creator saw, nor its hash.
type Token struct {
	ID         int64      `json:"id"`
	Name       string     `json:"name"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
	// RevokedAt is nil while the token is valid.
	RevokedAt *time.Time `json:"revoked_at"`
	// RevokedBy says who revoked it (a token name or the command line).
	RevokedBy string `json:"revoked_by"`
	// Role is viewer, operator or admin (see Role).
	Role Role `json:"role"`
}

// Active reports whether the token is not revoked.
func (t Token) Active() bool { return t.RevokedAt == nil }

const tokenCols = "id, name, created_at, last_used_at, revoked_at, revoked_by, role"

// CreateToken creates an API token named name and returns it; only its
// SHA-256 hash is stored.
func (s *Store) CreateToken(ctx context.Context, name string) (string, error) {
	_, tok, err := s.IssueToken(ctx, name)
	return tok, err
}

// IssueToken is CreateToken that also returns the stored record (its id
// is what revokes it). The token is an admin token; IssueTokenRole picks
// the role.
func (s *Store) IssueToken(ctx context.Context, name string) (Token, string, error) {
	return s.IssueTokenRole(ctx, name, RoleAdmin)
}

// MaxTokenNameLen bounds a token's name, in characters: the name is shown
// in token lists, in logs and in every refusal of a request it made.
const MaxTokenNameLen = 100

// CheckTokenName refuses a token name that is empty, longer than
// MaxTokenNameLen, or holds a control character (NUL cannot be stored; a
// line break would split a log line or a table row).
func CheckTokenName(name string) error {
	switch {
	case strings.TrimSpace(name) == "":
		return fmt.Errorf("name %q: must not be empty (it names the token in logs)", name)
	case !utf8.ValidString(name):
		return fmt.Errorf("name %q: must be valid UTF-8", name)
	case utf8.RuneCountInString(name) > MaxTokenNameLen:
		return fmt.Errorf("name %.20q…: must be at most %d characters (it names the token in logs), got %d", name, MaxTokenNameLen, utf8.RuneCountInString(name))
	case strings.IndexFunc(name, unicode.IsControl) >= 0:
		return fmt.Errorf("name %q: must not contain control characters (it names the token in logs)", name)
	}
	return nil
}

// IssueTokenRole creates an API token with role.
func (s *Store) IssueTokenRole(ctx context.Context, name string, role Role) (Token, string, error) {
	if err := CheckTokenName(name); err != nil {
		return Token{}, "", err
	}
	if _, err := ParseRole(string(role)); err != nil {
		return Token{}, "", err
	}
	tok, err := randomSecret(TokenPrefix)
	if err != nil {
		return Token{}, "", err
	}
	rows, err := s.Pool.Query(ctx, "INSERT INTO api_tokens (name, hash, role) VALUES ($1, $2, $3) RETURNING "+tokenCols, name, hashToken(tok), string(role))
	if err != nil {
		return Token{}, "", err
	}
	t, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[Token])
	if err != nil {
		return Token{}, "", err
	}
	return t, tok, nil
}

// VerifyToken returns the name of the token tok, or ok false when it is
// unknown or revoked.
func (s *Store) VerifyToken(ctx context.Context, tok string) (name string, ok bool, err error) {
	t, ok, err := s.CheckToken(ctx, tok)
	return t.Name, ok, err
}

// CheckToken returns the record of the valid token tok, or ok false when it
// is unknown or revoked. Nothing is cached: a revocation takes effect on
// every replica with the next request.
func (s *Store) CheckToken(ctx context.Context, tok string) (Token, bool, error) {
	if !strings.HasPrefix(tok, TokenPrefix) {
		return Token{}, false, nil
	}
	// last_used_at is kept to the minute, so that reading pages costs no
	// write per request.
	return queryOne[Token](ctx, s.Pool, `WITH t AS (SELECT `+tokenCols+` FROM api_tokens WHERE hash = $1 AND revoked_at IS NULL),
		u AS (UPDATE api_tokens SET last_used_at = now() FROM t
			WHERE api_tokens.id = t.id AND api_tokens.revoked_at IS NULL
				AND (t.last_used_at IS NULL OR t.last_used_at < now() - interval '1 minute'))
		SELECT `+tokenCols+` FROM t`, hashToken(tok))
}

// Token statuses of ListTokens.
const (
	TokensAll     = ""
	TokensActive  = "active"
	TokensRevoked = "revoked"
)

// ListTokens returns the tokens, newest first: all, or only the active or
// the revoked ones.
func (s *Store) ListTokens(ctx context.Context, status string) ([]Token, error) {
	where := ""
	switch status {
	case TokensAll:
	case TokensActive:
		where = " WHERE revoked_at IS NULL"
	case TokensRevoked:
		where = " WHERE revoked_at IS NOT NULL"
	default:
		return nil, fmt.Errorf("status %q: must be active or revoked", status)
	}
	rows, err := s.Pool.Query(ctx, "SELECT "+tokenCols+" FROM api_tokens"+where+" ORDER BY id DESC")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Token])
}

// RevokeToken revokes token id at once on every replica (they check the
// database on each request). by is recorded as revoked_by. Revoking a
// revoked token changes nothing and returns revoked false; an unknown id
// is ErrNotFound.
func (s *Store) RevokeToken(ctx context.Context, id int64, by string) (t Token, revoked bool, err error) {
	rows, err := s.Pool.Query(ctx, `UPDATE api_tokens SET revoked_at = now(), revoked_by = $2
		WHERE id = $1 AND revoked_at IS NULL RETURNING `+tokenCols, id, by)
	if err != nil {
		return Token{}, false, err
	}
	t, err = pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[Token])
	if err == nil {
		return t, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Token{}, false, err
	}
	rows, err = s.Pool.Query(ctx, "SELECT "+tokenCols+" FROM api_tokens WHERE id = $1", id)
	if err != nil {
		return Token{}, false, err
	}
	t, err = pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[Token])
	if errors.Is(err, pgx.ErrNoRows) {
		return Token{}, false, ErrNotFound
	}
	return t, false, err
}

// JobRun is the last run of a leader job.
type JobRun struct {
	Name       string    `json:"name"`
	ReplicaID  string    `json:"replica_id"`
	Term       int64     `json:"term"`
	StartedAt  time.Time `json:"started_at"`
	DurationMS int64     `json:"duration_ms"`
	Error      string    `json:"error"`
	Runs       int64     `json:"runs"`
}

// JobRuns returns the last run of each job.
func (s *Store) JobRuns(ctx context.Context) ([]JobRun, error) {
	rows, err := s.Pool.Query(ctx, "SELECT name, replica_id, term, started_at, duration_ms, error, runs FROM job_runs ORDER BY name")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[JobRun])
}

func mustSub(f embed.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err)
	}
	return sub
}

// Leader is the current term as recorded by pgleader.
type Leader struct {
	Term      int64     `json:"term"`
	LeaderID  string    `json:"leader_id"`
	ElectedAt time.Time `json:"elected_at"`
}

// CurrentLeader reads the current term of lockKey (pgleader owns the
// table and its SQL). ok is false while no leader was ever elected.
func (s *Store) CurrentLeader(ctx context.Context, lockKey int64) (l Leader, ok bool, err error) {
	r, ok, err := pgleader.CurrentTerm(ctx, s.Pool, lockKey)
	return Leader{Term: r.Term, LeaderID: r.LeaderID, ElectedAt: r.ElectedAt}, ok, err
}
