package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier is what the configuration and rollout functions need: the pool,
// a transaction of it, or a term-fenced transaction of a leader job.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrTypeChange refuses a new type for a configuration with revisions.
var ErrTypeChange = errors.New("the type of a configuration with revisions cannot change")

// ConfigDef is a named configuration (without its revisions' contents).
type ConfigDef struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Selector map[string]string `json:"selector"`
	Priority int               `json:"priority"`
	// Source is api or git; SourcePath the file in the repository.
	Source     string `json:"source"`
	SourcePath string `json:"source_path,omitempty"`
	// AutoRollout is the rollout spec started for each new revision from
	// Git (null: none).
	AutoRollout     json.RawMessage `json:"auto_rollout,omitempty"`
	CurrentRevision int             `json:"current_revision"`
	LatestRevision  int             `json:"latest_revision"`
	CreatedAt       time.Time       `json:"created_at"`
	UpdatedAt       time.Time       `json:"updated_at"`
	DeletedAt       *time.Time      `json:"deleted_at,omitempty"`
}

const configCols = `c.name, c.type, c.selector, c.priority, c.source, c.source_path, c.auto_rollout, c.current_revision,
	coalesce((SELECT max(revision) FROM config_revisions r WHERE r.config = c.name), 0), c.created_at, c.updated_at, c.deleted_at`

func scanConfig(r pgx.Row) (ConfigDef, error) {
	var c ConfigDef
	var auto []byte
	err := r.Scan(&c.Name, &c.Type, &c.Selector, &c.Priority, &c.Source, &c.SourcePath, &auto, &c.CurrentRevision,
		&c.LatestRevision, &c.CreatedAt, &c.UpdatedAt, &c.DeletedAt)
	if len(auto) > 0 && string(auto) != "null" {
		c.AutoRollout = auto
	}
	if c.Selector == nil {
		c.Selector = map[string]string{}
	}
	return c, err
}

// PutConfig creates configuration c or updates its type, selector,
// priority, source and auto rollout (a deleted one comes back). The type of
// a configuration with revisions cannot change.
func PutConfig(ctx context.Context, q Querier, c ConfigDef) (created bool, err error) {
	if c.Selector == nil {
		c.Selector = map[string]string{}
	}
	if c.Source == "" {
		c.Source = "api"
	}
	var auto any
	if len(c.AutoRollout) > 0 {
		auto = c.AutoRollout
	}
	var oldType string
	var revs int
	err = q.QueryRow(ctx, `SELECT c.type, (SELECT count(*) FROM config_revisions r WHERE r.config = c.name) FROM configs c WHERE c.name = $1`, c.Name).
		Scan(&oldType, &revs)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, err
	}
	if err == nil && revs > 0 && oldType != c.Type {
		return false, fmt.Errorf("type %q: %w (%s has revisions of type %s)", c.Type, ErrTypeChange, c.Name, oldType)
	}
	err = q.QueryRow(ctx, `INSERT INTO configs (name, type, selector, priority, source, source_path, auto_rollout)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (name) DO UPDATE SET type = $2, selector = $3, priority = $4, source = $5, source_path = $6,
			auto_rollout = $7, updated_at = now(), deleted_at = NULL
		RETURNING (xmax = 0)`, c.Name, c.Type, c.Selector, c.Priority, c.Source, c.SourcePath, auto).Scan(&created)
	return created, err
}

// MarkConfigDeleted marks a configuration deleted (its file was removed from
// Git): it matches no agent for new rollouts; agents keep their config.
func MarkConfigDeleted(ctx context.Context, q Querier, name string) error {
	_, err := q.Exec(ctx, `UPDATE configs SET deleted_at = now(), updated_at = now() WHERE name = $1 AND deleted_at IS NULL`, name)
	return err
}

// GetConfig returns one configuration.
func GetConfig(ctx context.Context, q Querier, name string) (ConfigDef, error) {
	c, err := scanConfig(q.QueryRow(ctx, "SELECT "+configCols+" FROM configs c WHERE c.name = $1", name))
	if errors.Is(err, pgx.ErrNoRows) {
		return c, ErrNotFound
	}
	return c, err
}

// ListConfigs returns every configuration (deleted ones too) by name.
func ListConfigs(ctx context.Context, q Querier) ([]ConfigDef, error) {
	rows, err := q.Query(ctx, "SELECT "+configCols+" FROM configs c ORDER BY c.name")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ConfigDef, error) { return scanConfig(r) })
}

// Revision is one immutable revision of a configuration.
type Revision struct {
	Config       string    `json:"config"`
	Revision     int       `json:"revision"`
	Content      string    `json:"content,omitempty"`
	Hash         string    `json:"hash"`
	Author       string    `json:"author"`
	SourceCommit string    `json:"source_commit,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
}

// AddRevision stores content as the next revision of configuration name,
// unless it equals the newest revision: then that one is returned with
// created false. The hash is ConfigHash(content), the hash under which
// agents receive it.
func AddRevision(ctx context.Context, q Querier, name, content, author, commit string) (Revision, bool, error) {
	var latest int
	var latestHash string
	// The row lock numbers concurrent revisions of one configuration in turn.
	err := q.QueryRow(ctx, `SELECT coalesce((SELECT revision FROM config_revisions WHERE config = $1 ORDER BY revision DESC LIMIT 1), 0),
		coalesce((SELECT hash FROM config_revisions WHERE config = $1 ORDER BY revision DESC LIMIT 1), '')
		FROM configs WHERE name = $1 FOR UPDATE`, name).Scan(&latest, &latestHash)
	if errors.Is(err, pgx.ErrNoRows) {
		return Revision{}, false, ErrNotFound
	}
	if err != nil {
		return Revision{}, false, err
	}
	hash := ConfigHash(content)
	if latest > 0 && hash == latestHash {
		r, err := GetRevision(ctx, q, name, latest)
		return r, false, err
	}
	r := Revision{Config: name, Revision: latest + 1, Content: content, Hash: hash, Author: author, SourceCommit: commit}
	err = q.QueryRow(ctx, `INSERT INTO config_revisions (config, revision, content, hash, author, source_commit)
		VALUES ($1, $2, $3, $4, $5, $6) RETURNING created_at`, name, r.Revision, content, hash, author, commit).Scan(&r.CreatedAt)
	return r, err == nil, err
}

// GetRevision returns a revision with its content.
func GetRevision(ctx context.Context, q Querier, name string, rev int) (Revision, error) {
	var r Revision
	err := q.QueryRow(ctx, `SELECT config, revision, content, hash, author, source_commit, created_at FROM config_revisions
		WHERE config = $1 AND revision = $2`, name, rev).Scan(&r.Config, &r.Revision, &r.Content, &r.Hash, &r.Author, &r.SourceCommit, &r.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, ErrNotFound
	}
	return r, err
}

// Revisions lists the revisions of a configuration, newest first, without
// their contents.
func Revisions(ctx context.Context, q Querier, name string) ([]Revision, error) {
	rows, err := q.Query(ctx, `SELECT config, revision, '', hash, author, source_commit, created_at FROM config_revisions
		WHERE config = $1 ORDER BY revision DESC`, name)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Revision])
}

// PrecedenceSQL is the name of the configuration assigned to the agent row
// a: among the configurations that are not deleted and whose selector
// matches its attributes, the highest priority, then the smallest name.
const PrecedenceSQL = `(SELECT c.name FROM configs c WHERE c.deleted_at IS NULL AND a.attrs @> c.selector
	ORDER BY c.priority DESC, c.name LIMIT 1)`

// Assignment is the configuration side of one agent: which configuration
// its attributes select, the revision it should run and what it reports.
type Assignment struct {
	InstanceUID string `json:"instance_uid"`
	// Config is the configuration that the selectors and priorities assign
	// (empty: none matches); Matching lists all that match, winner first.
	Config   string   `json:"config"`
	Matching []string `json:"matching"`
	// DesiredConfig and DesiredRevision name the revision the agent should
	// run (empty/0 for a config pushed directly to the agent, cleared, or
	// none).
	DesiredConfig      string `json:"desired_config"`
	DesiredRevision    int    `json:"desired_revision"`
	DesiredHash        string `json:"desired_hash"`
	EffectiveConfig    string `json:"effective_config"`
	RemoteConfigStatus string `json:"remote_config_status"`
	RemoteConfigHash   string `json:"remote_config_hash"`
	RemoteConfigError  string `json:"remote_config_error"`
	// InSync is true when the agent reports the desired hash as applied.
	InSync bool `json:"in_sync"`
}

// AgentAssignment returns the assignment of agent uid.
func AgentAssignment(ctx context.Context, q Querier, uid string) (Assignment, error) {
	var a Assignment
	err := q.QueryRow(ctx, `SELECT a.instance_uid, coalesce(array(SELECT c.name FROM configs c WHERE c.deleted_at IS NULL AND a.attrs @> c.selector
			ORDER BY c.priority DESC, c.name), '{}'), a.desired_config_name, a.desired_revision, a.desired_config_hash, a.effective_config,
			a.remote_config_status, a.remote_config_hash, a.remote_config_error
		FROM agents a WHERE a.instance_uid = $1`, uid).Scan(&a.InstanceUID, &a.Matching, &a.DesiredConfig, &a.DesiredRevision,
		&a.DesiredHash, &a.EffectiveConfig, &a.RemoteConfigStatus, &a.RemoteConfigHash, &a.RemoteConfigError)
	if errors.Is(err, pgx.ErrNoRows) {
		return a, ErrNotFound
	}
	if len(a.Matching) > 0 {
		a.Config = a.Matching[0]
	}
	a.InSync = a.DesiredHash != "" && a.DesiredHash == a.RemoteConfigHash && a.RemoteConfigStatus == "applied"
	return a, err
}
