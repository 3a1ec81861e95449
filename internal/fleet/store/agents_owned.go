package store

// The queries on the store's tables that other packages need: rollouts
// (configs, rollout), package rollouts (upgrades), package offers
// (artifacts), the leader jobs (jobs), Git sync (gitops) and the load tool
// (cmd/myriarch-loadagents). Each takes a Querier, so that a caller can run
// it inside its own (fenced) transaction; the tables stay this package's
// (internal/archtest.TableOwners).

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/myriarch/myriarch/internal/fleet/eventbus"
)

// Kinds of DesiredSource.
const (
	// DesiredFromRevision: a revision of a named configuration, sent by a
	// rollout or given to a new agent.
	DesiredFromRevision = "revision"
	// DesiredDirect: a config pushed directly to the agent
	// (PUT /api/v1/agents/{uid}/config).
	DesiredDirect = "direct"
)

// DesiredSource is where an agent's desired config came from, as recorded
// when it was written. An agent without a desired config, or whose desired
// config was cleared, has none (nil).
type DesiredSource struct {
	// Kind is DesiredFromRevision or DesiredDirect.
	Kind string `json:"kind"`
	// Config and Revision name the revision (kind revision).
	Config   string `json:"config,omitempty"`
	Revision int    `json:"revision,omitempty"`
	// RolloutID is the rollout that sent the revision; absent when the
	// revision was given to a new agent without a rollout.
	RolloutID *int64 `json:"rollout_id,omitempty"`
	// By is who wrote it: for a direct push the API token ("token NAME"),
	// for a rollout whoever created the rollout.
	By string `json:"by"`
	// At is when the desired config was written.
	At time.Time `json:"at"`
}

// desiredWrite says what a write of desired configs records as their
// source.
type desiredWrite struct {
	kind    string // "" (cleared), DesiredFromRevision or DesiredDirect
	config  string
	rev     int
	rollout *int64
	by      string
}

// writeDesired is the one writer of agents' desired configs: it sets the
// desired config of uids to body with its hash, records its source, and
// notifies every replica (NotifyChannel, payload the uid) at the commit.
// A direct push or a clear forgets the configuration and revision it
// replaced, so that nothing shows a revision that the agent no longer
// runs. It returns how many agents it updated.
func writeDesired(ctx context.Context, q Querier, uids []string, body, hash string, src desiredWrite) (int64, error) {
	tag, err := q.Exec(ctx, `UPDATE agents SET desired_config = $2, desired_config_hash = $3, desired_config_at = now(),
			desired_config_name = $4, desired_revision = $5, desired_source = $6, desired_rollout_id = $7, desired_by = $8
		WHERE instance_uid = ANY($1)`, uids, body, hash, src.config, src.rev, src.kind, src.rollout, src.by)
	if err != nil {
		return 0, err
	}
	if err := eventbus.Notify(ctx, q, eventbus.DesiredConfig, uids...); err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// SetDesiredRevision sets the desired config of uids to revision rev of
// configuration config without a rollout (the assignment of new agents)
// and notifies the replicas at the commit.
func SetDesiredRevision(ctx context.Context, q Querier, uids []string, config string, rev Revision) error {
	_, err := writeDesired(ctx, q, uids, rev.Content, rev.Hash, desiredWrite{kind: DesiredFromRevision, config: config, rev: rev.Revision})
	return err
}

// SetDesiredRevisionBy is SetDesiredRevision for rollout rolloutID,
// created by by: both are recorded as the source (a rollout's apply and
// rollback, in its fenced transaction).
func SetDesiredRevisionBy(ctx context.Context, q Querier, uids []string, config string, rev Revision, rolloutID int64, by string) error {
	_, err := writeDesired(ctx, q, uids, rev.Content, rev.Hash,
		desiredWrite{kind: DesiredFromRevision, config: config, rev: rev.Revision, rollout: &rolloutID, by: by})
	return err
}

// SetCurrentRevision makes rev the current revision of configuration
// config (the one new agents get).
func SetCurrentRevision(ctx context.Context, q Querier, config string, rev int) error {
	_, err := q.Exec(ctx, `UPDATE configs SET current_revision = $2 WHERE name = $1`, config, rev)
	return err
}

// MarkGitConfigsDeleted marks deleted every configuration from Git whose
// name is not in keep (the files of the synced commit) and returns their
// names.
func MarkGitConfigsDeleted(ctx context.Context, q Querier, keep []string) ([]string, error) {
	rows, err := q.Query(ctx, `UPDATE configs SET deleted_at = now(), updated_at = now()
		WHERE source = 'git' AND deleted_at IS NULL AND NOT (name = ANY($1)) RETURNING name`, keep)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// NewAgent is an online agent without any desired config whose attributes
// select a configuration with a current revision.
type NewAgent struct {
	UID      string
	Config   string
	Revision int
}

// NewAgents returns up to limit online agents that have no desired config
// at all, with the configuration that the selectors and priorities assign
// them (PrecedenceSQL) when it has a current revision and is not in skip,
// by configuration then uid.
func NewAgents(ctx context.Context, q Querier, skip []string, limit int) ([]NewAgent, error) {
	if skip == nil {
		skip = []string{} // NOT (x = ANY(NULL)) would be NULL: nothing
	}
	rows, err := q.Query(ctx, `SELECT a.instance_uid, c.name, c.current_revision FROM agents a
		JOIN configs c ON c.name = `+PrecedenceSQL+`
		WHERE a.desired_config_hash = '' AND a.status = 'online' AND c.current_revision > 0
			AND NOT (c.name = ANY($1))
		ORDER BY c.name, a.instance_uid LIMIT $2`, skip, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[NewAgent])
}

// AgentsAssigned returns, by uid, the agents whose attributes contain
// attrs and to which the selectors and priorities assign configuration
// config.
func AgentsAssigned(ctx context.Context, q Querier, attrs map[string]string, config string) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT a.instance_uid FROM agents a WHERE a.attrs @> $1 AND `+PrecedenceSQL+` = $2
		ORDER BY a.instance_uid`, attrs, config)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// ConfigReport is what an agent last reported about its remote config and
// its health.
type ConfigReport struct {
	Online bool
	// Healthy is nil when the agent reported no health.
	Healthy *bool
	// LastError is the last_error of its health ("" if none).
	LastError                             string
	ConfigStatus, ConfigHash, ConfigError string
}

// Unhealthy reports whether the agent reported itself unhealthy.
func (r ConfigReport) Unhealthy() bool { return r.Healthy != nil && !*r.Healthy }

// ConfigReports returns the reports of the agents among uids that exist.
func ConfigReports(ctx context.Context, q Querier, uids []string) (map[string]ConfigReport, error) {
	rows, err := q.Query(ctx, `SELECT instance_uid, status = 'online', healthy, coalesce(health->>'last_error', ''),
			remote_config_status, remote_config_hash, remote_config_error
		FROM agents WHERE instance_uid = ANY($1)`, uids)
	return byUID(rows, err, func(r *ConfigReport) []any {
		return []any{&r.Online, &r.Healthy, &r.LastError, &r.ConfigStatus, &r.ConfigHash, &r.ConfigError}
	})
}

// PackageReport is what an agent last reported about one package, and
// whether it is online and healthy.
type PackageReport struct {
	Online bool
	// Healthy is nil when the agent reported no health.
	Healthy                            *bool
	HasVersion, HasHash, Status, Error string
}

// PackageReports returns the reports about package pkg of the agents among
// uids that exist.
func PackageReports(ctx context.Context, q Querier, uids []string, pkg string) (map[string]PackageReport, error) {
	rows, err := q.Query(ctx, `SELECT instance_uid, status = 'online', healthy,
			coalesce(package_statuses->'packages'->$2->>'agent_has_version', ''), coalesce(package_statuses->'packages'->$2->>'agent_has_hash', ''),
			coalesce(package_statuses->'packages'->$2->>'status', ''), coalesce(package_statuses->'packages'->$2->>'error', '')
		FROM agents WHERE instance_uid = ANY($1)`, uids, pkg)
	return byUID(rows, err, func(r *PackageReport) []any {
		return []any{&r.Online, &r.Healthy, &r.HasVersion, &r.HasHash, &r.Status, &r.Error}
	})
}

// PackageStatuses is an agent's stored OpAMP package statuses: each
// package's status as stored (JSON), and the
// server_provided_all_packages_hash it last reported ("" if none).
type PackageStatuses struct {
	Packages        map[string]json.RawMessage
	AllPackagesHash string
}

// AgentPackageStatuses returns the package statuses of the agents among
// uids that exist.
func AgentPackageStatuses(ctx context.Context, q Querier, uids []string) (map[string]PackageStatuses, error) {
	rows, err := q.Query(ctx, `SELECT instance_uid, coalesce(package_statuses->'packages', '{}'),
			coalesce(package_statuses->>'server_provided_all_packages_hash', '')
		FROM agents WHERE instance_uid = ANY($1)`, uids)
	return byUID(rows, err, func(p *PackageStatuses) []any { return []any{&p.Packages, &p.AllPackagesHash} })
}

// PackageAgent is an agent that accepts packages, with the version of a
// package that it reports to have ("" if none).
type PackageAgent struct {
	UID        string
	HasVersion string
}

// PackageAgents returns, by uid, the agents whose attributes contain attrs
// and that declare one of the capability bits caps, each with the version
// of pkg it reports to have.
func PackageAgents(ctx context.Context, q Querier, pkg string, attrs map[string]string, caps uint64) ([]PackageAgent, error) {
	sel, _ := json.Marshal(attrs)
	if attrs == nil {
		sel = []byte("{}")
	}
	rows, err := q.Query(ctx, `SELECT instance_uid, coalesce(package_statuses->'packages'->$1->>'agent_has_version', '')
		FROM agents WHERE attrs @> $2::jsonb AND capabilities & $3 <> 0 ORDER BY instance_uid`,
		pkg, string(sel), int64(caps))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[PackageAgent])
}

// OfferTarget is what offering a package to an agent needs to know of it:
// its platform (os.type and host.arch, lower case, "" if not reported) and
// its capabilities.
type OfferTarget struct {
	OS, Arch     string
	Capabilities uint64
}

// AgentOfferTarget returns the platform and capabilities of agent uid, or
// ErrNotFound.
func AgentOfferTarget(ctx context.Context, q Querier, uid string) (OfferTarget, error) {
	var t OfferTarget
	var caps int64
	err := q.QueryRow(ctx, `SELECT lower(coalesce(attrs->>'os.type', '')), lower(coalesce(attrs->>'host.arch', '')), capabilities
		FROM agents WHERE instance_uid = $1`, uid).Scan(&t.OS, &t.Arch, &caps)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, ErrNotFound
	}
	t.Capabilities = uint64(caps)
	return t, err
}

// AgentPlatforms returns the "os/arch" pairs (lower case) that the fleet's
// agents report (those without os.type are left out).
func AgentPlatforms(ctx context.Context, q Querier) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT DISTINCT lower(attrs->>'os.type') || '/' || lower(coalesce(attrs->>'host.arch', ''))
		FROM agents WHERE attrs ? 'os.type'`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// InstalledPackageVersions returns the package versions that agents report
// as installed in their package statuses, as package + "@" + version.
func InstalledPackageVersions(ctx context.Context, q Querier) ([]string, error) {
	// package_statuses is stored by the OpAMP server as
	// {"packages": {"<name>": {"agent_has_version": "...", ...}}, "error": ""}.
	rows, err := q.Query(ctx, `SELECT DISTINCT p.k || '@' || (p.s->>'agent_has_version')
		FROM agents, jsonb_each(coalesce(package_statuses->'packages', '{}')) AS p(k, s)
		WHERE coalesce(p.s->>'agent_has_version', '') <> ''`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// RecordJobRun records run (its name, replica, term, start, duration and
// error; Runs is ignored) as the last run of its job and counts it.
func RecordJobRun(ctx context.Context, q Querier, run JobRun) error {
	_, err := q.Exec(ctx, `INSERT INTO job_runs (name, replica_id, term, started_at, duration_ms, error, runs) VALUES ($1, $2, $3, $4, $5, $6, 1)
		ON CONFLICT (name) DO UPDATE SET replica_id = $2, term = $3, started_at = $4, duration_ms = $5, error = $6, runs = job_runs.runs + 1`,
		run.Name, run.ReplicaID, run.Term, run.StartedAt, run.DurationMS, run.Error)
	return err
}

// SweepOffline marks offline the online agents not seen for longer than
// after, with a marked_offline event each, and returns how many.
func SweepOffline(ctx context.Context, q Querier, after time.Duration) (int64, error) {
	tag, err := q.Exec(ctx, `WITH swept AS (
			UPDATE agents SET status = 'offline'
			WHERE status = 'online' AND last_seen < now() - make_interval(secs => $1)
			RETURNING instance_uid, replica_id)
		INSERT INTO agent_events (instance_uid, at, kind, replica_id, detail)
		SELECT instance_uid, now(), 'marked_offline', replica_id, 'no heartbeat for ' || $2 FROM swept`, after.Seconds(), after.String())
	return tag.RowsAffected(), err
}

// PruneEvents deletes the agent events older than retention.
func PruneEvents(ctx context.Context, q Querier, retention time.Duration) error {
	_, err := q.Exec(ctx, `DELETE FROM agent_events WHERE at < now() - make_interval(secs => $1)`, retention.Seconds())
	return err
}

// OnlineByReplica counts the online agents by the replica they are
// connected to.
func OnlineByReplica(ctx context.Context, q Querier) (map[string]int64, error) {
	rows, err := q.Query(ctx, `SELECT replica_id, count(*) FROM agents WHERE status = 'online' GROUP BY 1 ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	m := map[string]int64{}
	var rid string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&rid, &n}, func() error { m[rid] = n; return nil })
	return m, err
}

// OnlineOn counts the online agents: those connected to replica, all, and
// those connected to another replica.
func OnlineOn(ctx context.Context, q Querier, replica string) (onReplica, online, elsewhere int64, err error) {
	err = q.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'online' AND replica_id = $1), count(*) FILTER (WHERE status = 'online'),
		count(*) FILTER (WHERE status = 'online' AND replica_id <> $1) FROM agents`, replica).Scan(&onReplica, &online, &elsewhere)
	return onReplica, online, elsewhere, err
}

// CountOnline counts the online agents whose attributes contain attrs (all
// online agents when attrs is empty).
func CountOnline(ctx context.Context, q Querier, attrs map[string]string) (int64, error) {
	var n int64
	var err error
	if len(attrs) == 0 {
		err = q.QueryRow(ctx, `SELECT count(*) FROM agents WHERE status = 'online'`).Scan(&n)
	} else {
		err = q.QueryRow(ctx, `SELECT count(*) FROM agents WHERE status = 'online' AND attrs @> $1`, attrs).Scan(&n)
	}
	return n, err
}

// OnlineOnByConn counts the online agents on replica: those whose
// connection id is not connID (WebSocket agents, for connID the plain-HTTP
// one), those whose it is, and all online agents anywhere.
func OnlineOnByConn(ctx context.Context, q Querier, replica, connID string) (other, withConn, online int64, err error) {
	err = q.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'online' AND replica_id = $1 AND connection_id <> $2),
		count(*) FILTER (WHERE status = 'online' AND replica_id = $1 AND connection_id = $2),
		count(*) FILTER (WHERE status = 'online') FROM agents`, replica, connID).Scan(&other, &withConn, &online)
	return other, withConn, online, err
}

// SampleOnline returns up to n online agents picked at random.
func SampleOnline(ctx context.Context, q Querier, n int) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT instance_uid FROM agents WHERE status = 'online' ORDER BY random() LIMIT $1`, n)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// OnlineAmongByConn counts which of uids are online: those whose
// connection id is not connID and those whose it is.
func OnlineAmongByConn(ctx context.Context, q Querier, uids []string, connID string) (other, withConn int64, err error) {
	err = q.QueryRow(ctx, `SELECT count(*) FILTER (WHERE connection_id <> $2), count(*) FILTER (WHERE connection_id = $2)
		FROM agents WHERE status = 'online' AND instance_uid = ANY($1)`, uids, connID).Scan(&other, &withConn)
	return other, withConn, err
}
