-- +goose Up
CREATE TABLE agents (
    instance_uid         text PRIMARY KEY,
    identifying          jsonb NOT NULL DEFAULT '{}',
    non_identifying      jsonb NOT NULL DEFAULT '{}',
    -- attrs merges both attribute sets; label selectors match on it.
    attrs                jsonb NOT NULL DEFAULT '{}',
    healthy              boolean,
    health               jsonb,
    effective_config     text NOT NULL DEFAULT '',
    remote_config_status text NOT NULL DEFAULT '',
    remote_config_hash   text NOT NULL DEFAULT '',
    remote_config_error  text NOT NULL DEFAULT '',
    package_statuses     jsonb,
    capabilities         bigint NOT NULL DEFAULT 0,
    status               text NOT NULL DEFAULT 'online' CHECK (status IN ('online', 'offline')),
    replica_id           text NOT NULL DEFAULT '',
    -- connection_id identifies one connection of one replica process; a
    -- disconnect or flush of an older connection never overwrites a newer.
    connection_id        text NOT NULL DEFAULT '',
    first_seen           timestamptz NOT NULL DEFAULT now(),
    last_seen            timestamptz NOT NULL DEFAULT now(),
    desired_config       text NOT NULL DEFAULT '',
    desired_config_hash  text NOT NULL DEFAULT '',
    desired_config_at    timestamptz
);
CREATE INDEX agents_status ON agents (status, last_seen);
CREATE INDEX agents_replica ON agents (replica_id);
CREATE INDEX agents_attrs ON agents USING gin (attrs jsonb_path_ops);

CREATE TABLE agent_events (
    id           bigserial PRIMARY KEY,
    instance_uid text NOT NULL,
    at           timestamptz NOT NULL,
    kind         text NOT NULL,
    replica_id   text NOT NULL DEFAULT '',
    detail       text NOT NULL DEFAULT ''
);
CREATE INDEX agent_events_agent ON agent_events (instance_uid, id DESC);
CREATE INDEX agent_events_at ON agent_events (at);

CREATE TABLE api_tokens (
    id           bigserial PRIMARY KEY,
    name         text NOT NULL,
    hash         bytea NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz
);

CREATE TABLE job_runs (
    name        text PRIMARY KEY,
    replica_id  text NOT NULL,
    term        bigint NOT NULL,
    started_at  timestamptz NOT NULL,
    duration_ms bigint NOT NULL,
    error       text NOT NULL DEFAULT '',
    runs        bigint NOT NULL DEFAULT 0
);

-- +goose Down
DROP TABLE job_runs;
DROP TABLE api_tokens;
DROP TABLE agent_events;
DROP TABLE agents;
