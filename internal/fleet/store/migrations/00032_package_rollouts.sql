-- +goose Up
-- Upgrades of agent software as rollouts (package upgrades): waves, a gate
-- of package statuses and health, pause or roll back on failures.
CREATE TABLE package_rollouts (
    id          bigserial PRIMARY KEY,
    package     text NOT NULL,
    version     text NOT NULL,
    spec        jsonb NOT NULL,
    state       text NOT NULL,
    reason      text NOT NULL DEFAULT '',
    wave        int NOT NULL DEFAULT 0,
    waves       int NOT NULL DEFAULT 0,
    -- requested is an operator command (pause, resume, rollback, abort)
    -- that the engine carries out in its next fenced step.
    requested   text NOT NULL DEFAULT '',
    created_by  text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    term        bigint NOT NULL DEFAULT 0
);
CREATE INDEX package_rollouts_active ON package_rollouts (state) WHERE state IN ('pending', 'running', 'paused', 'rolling_back');

CREATE TABLE package_rollout_agents (
    rollout_id       bigint NOT NULL REFERENCES package_rollouts (id) ON DELETE CASCADE,
    instance_uid     text NOT NULL,
    wave             int NOT NULL,
    state            text NOT NULL DEFAULT 'pending',
    previous_version text NOT NULL DEFAULT '',
    offered_hash     text NOT NULL DEFAULT '',
    sent_at          timestamptz,
    installed_at     timestamptz,
    error            text NOT NULL DEFAULT '',
    PRIMARY KEY (rollout_id, instance_uid)
);

-- +goose Down
DROP TABLE package_rollout_agents;
DROP TABLE package_rollouts;
