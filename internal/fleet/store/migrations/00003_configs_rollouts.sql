-- +goose Up
-- Named configurations. selector and priority assign a configuration to the
-- agents whose attributes match; when several match, the highest priority
-- wins, then the smallest name.
CREATE TABLE configs (
    name             text PRIMARY KEY,
    type             text NOT NULL,
    selector         jsonb NOT NULL DEFAULT '{}',
    priority         integer NOT NULL DEFAULT 0,
    -- source is api or git; source_path is the file in the repository.
    source           text NOT NULL DEFAULT 'api',
    source_path      text NOT NULL DEFAULT '',
    -- auto_rollout is a rollout spec (JSON) started for every new revision
    -- from Git; NULL starts none.
    auto_rollout     jsonb,
    -- current_revision is the revision the last successful rollout delivered.
    current_revision integer NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    -- deleted_at is set when the file was removed from Git: no new rollouts,
    -- agents keep what they have.
    deleted_at       timestamptz
);

CREATE TABLE config_revisions (
    config        text NOT NULL REFERENCES configs (name),
    revision      integer NOT NULL,
    content       text NOT NULL,
    hash          text NOT NULL,
    author        text NOT NULL DEFAULT '',
    source_commit text NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (config, revision)
);

-- +goose StatementBegin
CREATE FUNCTION myriarch_revisions_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'configuration revisions are immutable';
END $$;
-- +goose StatementEnd
CREATE TRIGGER config_revisions_immutable BEFORE UPDATE OR DELETE ON config_revisions
    FOR EACH ROW EXECUTE FUNCTION myriarch_revisions_immutable();

-- The configuration and revision that the desired config of an agent came
-- from (empty/0 for a config set directly with PUT /agents/{uid}/config).
ALTER TABLE agents ADD COLUMN desired_config_name text NOT NULL DEFAULT '';
ALTER TABLE agents ADD COLUMN desired_revision integer NOT NULL DEFAULT 0;

CREATE TABLE rollouts (
    id               bigserial PRIMARY KEY,
    config           text NOT NULL REFERENCES configs (name),
    from_revision    integer NOT NULL DEFAULT 0,
    to_revision      integer NOT NULL,
    spec             jsonb NOT NULL,
    state            text NOT NULL CHECK (state IN ('pending', 'running', 'paused', 'rolling_back',
                         'succeeded', 'aborted', 'rolled_back', 'failed')),
    -- requested is an operator command (pause, resume, abort, rollback)
    -- that the leader's engine carries out with a fenced write.
    requested        text NOT NULL DEFAULT '',
    wave             integer NOT NULL DEFAULT 0,
    -- failed_ack is the number of failed agents an operator resumed past.
    failed_ack       integer NOT NULL DEFAULT 0,
    waves            integer NOT NULL DEFAULT 0,
    reason           text NOT NULL DEFAULT '',
    created_by       text NOT NULL DEFAULT '',
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    last_progress_at timestamptz NOT NULL DEFAULT now(),
    -- plan_started_at and planned_at bracket the planner's work.
    plan_started_at  timestamptz,
    planned_at       timestamptz,
    finished_at      timestamptz,
    term             bigint NOT NULL DEFAULT 0
);
CREATE INDEX rollouts_active ON rollouts (state) WHERE state IN ('pending', 'running', 'paused', 'rolling_back');

CREATE TABLE rollout_waves (
    rollout_id     bigint NOT NULL REFERENCES rollouts (id),
    wave           integer NOT NULL,
    size           integer NOT NULL,
    started_at     timestamptz,
    completed_at   timestamptz,
    gate_passed_at timestamptz,
    PRIMARY KEY (rollout_id, wave)
);

CREATE TABLE rollout_agents (
    rollout_id     bigint NOT NULL REFERENCES rollouts (id),
    instance_uid   text NOT NULL,
    wave           integer NOT NULL,
    seq            integer NOT NULL,
    state          text NOT NULL CHECK (state IN ('pending', 'in_progress', 'applied', 'failed', 'skipped')),
    -- rollback is '', sent, applied or failed.
    rollback       text NOT NULL DEFAULT '',
    rollback_at    timestamptz,
    sent_at        timestamptz,
    reported_at    timestamptz,
    healthy_since  timestamptz,
    detail         text NOT NULL DEFAULT '',
    PRIMARY KEY (rollout_id, instance_uid)
);
CREATE INDEX rollout_agents_wave ON rollout_agents (rollout_id, wave, state, seq);
CREATE INDEX rollout_agents_agent ON rollout_agents (instance_uid);

-- Every command to an agent is recorded here, in the same fenced
-- transaction that sets its desired config, before any replica sends it.
-- An assign intent (no rollout) gives an agent that has no desired config
-- the current revision of the configuration assigned to it.
CREATE TABLE rollout_intents (
    id           bigserial PRIMARY KEY,
    rollout_id   bigint REFERENCES rollouts (id),
    instance_uid text NOT NULL,
    config       text NOT NULL DEFAULT '',
    wave         integer NOT NULL,
    term         bigint NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('apply', 'rollback', 'assign')),
    revision     integer NOT NULL,
    hash         text NOT NULL,
    at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rollout_intents_rollout ON rollout_intents (rollout_id, id);
CREATE INDEX rollout_intents_agent ON rollout_intents (instance_uid, id);

-- The GitOps source as last polled (one row per repository URL+ref+path).
CREATE TABLE gitops_sources (
    source        text PRIMARY KEY,
    last_commit   text NOT NULL DEFAULT '',
    last_poll_at  timestamptz,
    last_change_at timestamptz,
    last_error    text NOT NULL DEFAULT '',
    -- poll_requested_at is set by the webhook (on any replica); the
    -- leader polls at once when it is newer than last_poll_at.
    poll_requested_at timestamptz,
    term          bigint NOT NULL DEFAULT 0
);

-- +goose Down
DROP TABLE gitops_sources;
DROP TABLE rollout_intents;
DROP TABLE rollout_agents;
DROP TABLE rollout_waves;
DROP TABLE rollouts;
ALTER TABLE agents DROP COLUMN desired_revision;
ALTER TABLE agents DROP COLUMN desired_config_name;
DROP TABLE config_revisions;
DROP FUNCTION myriarch_revisions_immutable() CASCADE;
DROP TABLE configs;
