package archtest

// TableOwner names the one package (a directory relative to the module
// root) whose production code may hold SQL naming Table. A table with two
// rows has two owners that never run together (the lease stores: one per
// backend).
type TableOwner struct {
	Table string
	Owner string
}

// TableOwners is the owner of every table of the module's databases. Every
// other package reads and writes a table through its owner's functions,
// which take a pool, a connection or a transaction (so that a caller can
// write inside its own fenced transaction). TestTableOwners enforces it;
// docs/architecture.md renders it.
var TableOwners = []TableOwner{
	{"agents", "internal/fleet/store"},
	{"agent_events", "internal/fleet/store"},
	{"agent_credentials", "internal/fleet/store"},
	{"api_tokens", "internal/fleet/store"},
	{"ui_sessions", "internal/fleet/store"},
	{"configs", "internal/fleet/store"},
	{"config_revisions", "internal/fleet/store"},
	{"job_runs", "internal/fleet/store"},

	{"rollouts", "internal/fleet/rollout"},
	{"rollout_waves", "internal/fleet/rollout"},
	{"rollout_intents", "internal/fleet/rollout"},
	{"rollout_agents", "internal/fleet/rollout"},

	{"package_rollouts", "internal/fleet/upgrades"},
	{"package_rollout_agents", "internal/fleet/upgrades"},

	{"package_sources", "internal/fleet/releases"},
	{"package_releases", "internal/fleet/releases"},
	{"package_assets", "internal/fleet/releases"},

	{"gitops_sources", "internal/fleet/gitops"},

	{"agent_telemetry", "internal/fleet/telemetry"},
	{"fleet_telemetry", "internal/fleet/telemetry"},

	{"artifact_downloads", "internal/fleet/artifacts"},
	{"artifact_download_keys", "internal/fleet/artifacts"},
	{"artifact_blobs", "internal/fleet/artifacts"},
	{"agent_package_offers", "internal/fleet/artifacts"},

	{"myriarch_leader_term", "pgleader"},
	{"myriarch_replicas", "pgleader"},

	{"myriarch_leases", "lease/pgstore"},
	{"myriarch_leases", "lease/sqlitestore"},
	{"myriarch_lease_schema", "lease/pgstore"},
	{"myriarch_bridge_outbox", "internal/bridge/outbox"},
	{"myriarch_bridge_outbox_fence", "internal/bridge/outbox"},

	{"leaderlab_writes", "internal/leaderlab"},
}
